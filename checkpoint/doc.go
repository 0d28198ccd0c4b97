// Package checkpoint keeps the resume index (bbolt), the output layout and the mover that
// writes it, and verifies the outputs against the index so a crashed job resumes losing nothing.
//
// The index is the single source of truth for which samples are done. A sample is
// committed done only after Mover.Move has returned, that is after its output file and
// the directory entry naming it are durable; each output file also carries its own
// sample, rid, dataset fingerprint and crc32c, so Verify can check the index against the
// disk and rebuild it from the files alone.
package checkpoint
