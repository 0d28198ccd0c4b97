// Package checkpoint keeps the resume index (bbolt), the output layout and the mover that
// writes it, and verifies the outputs against the index so a crashed job resumes losing nothing.
//
// The index is the single source of truth for which samples are done. A sample is
// committed done only once its output file and the directory entry naming it are
// durable (Staged.CommitTo holds that order for the run and the fault tests); each output file also carries its own
// sample, rid, dataset and config fingerprints and crc32c, so Verify can check the index
// against the disk and rebuild it from the files alone.
//
// # Index schema
//
// The index is one bbolt file, state_dir/index.db, schema version 1:
//
//	index.db
//	├──meta
//	│  ├──schema_version : 8-byte big-endian; Open refuses a version it does not know
//	│  ├──dataset_fingerprint : string; the caller refuses --resume against another dataset
//	│  ├──dataset_path : string, for messages only
//	│  ├──config_fingerprint : string; outputs carry it too, and Verify compares them
//	│  ├──config_fields : the settings config_fingerprint hashes, "name=value" a line,
//	│  │                  so a mismatch names what changed; optional, absent in an index
//	│  │                  from before it (a resume under the same config adds it)
//	│  ├──total : 8-byte big-endian; samples in the dataset
//	│  ├──created : RFC 3339 time; its presence marks an initialised job
//	│  ├──attempt_base : 8-byte big-endian; the highest attempt any sample reached
//	│  │                 before the last Reset; optional, absent reads as 0
//	│  ├──output_format : string, the layout's name ("specforge+gzip"); where verify
//	│  │                  finds files; optional, absent reads as safetensors
//	│  └──shard : 16 bytes, index then count, 8-byte big-endian each: the index covers
//	│             shard index of count (the job split across nodes); optional, absent
//	│             is the whole dataset
//	├──samples
//	│  └──<sample> : 8-byte big-endian sample index → record (see encodeRecord)
//	└──counters
//	   ├──done : 8-byte big-endian
//	   ├──failed : 8-byte big-endian
//	   ├──bytes : 8-byte big-endian
//	   ├──tokens : 8-byte big-endian
//	   └──imported : 8-byte big-endian; done samples extract import brought in;
//	                 optional, absent reads as 0. All five are written in the same txn
//	                 as the records they sum, so they never drift
//
// A sample with no record is pending with attempt 0. RecordAttempt accepts only an
// attempt above max(record's attempt, attempt_base) (NextAttempt), and Reset (--fresh, or a new dataset
// on an index without progress) raises attempt_base to the highest attempt recorded
// before it drops the records: a rid s<sample>-a<attempt> is never used twice for the
// life of an output dir.
//
// attempt_base was added without a version bump: an index written before it has no
// such key, which reads as 0, exactly the base it had; testdata/index-v1.db is such a
// file. Older builds ignore the key, so they can still open a newer index, but a Reset
// by an older build forgets the base. shard was added the same way: an older build
// that opens a shard's index sees a job of the whole dataset, but it is only ever run
// with the shard's state_dir, which a build without shards never derives.
//
// output_format and imported were added like attempt_base, without a version bump. An
// imported record is a done record whose stored rid starts with "import:" (Record.Imported);
// an older build reads it as done with an odd rid. Its file may be another tool's,
// without extract's metadata: Verify then checks it against the record (tokens, and deep,
// the crc32c import computed).
//
// A record's source id (the sample's id in the data it came from) is an optional field
// after the error, also without a version bump: a record without one has exactly the
// old layout, and an older build decodes a record with one by stopping after the error.
// An older build that rewrites such a record (a retry, MarkFailed) drops the id; a
// rebuild of a lost index (verify --repair) reads it back from the file's source_id.
//
// # Output formats
//
// Layout names where a sample's file lives and in which format (safetensors, specforge
// .ckpt[.gz], modelopt .pt; docs/formats.md). One writer streams every format from the
// dump, and one reader (openSample) reads them all for Verify, Import and Export. The
// crc32c of a file is over its four tensors' bytes in canonical order (input_ids,
// loss_mask, hidden, aux), whatever the container.
//
// # Damage
//
// bbolt maps the file and trusts its meta pages: a truncated index makes it touch pages
// past the end of the file, which is SIGBUS, a crash no recover can catch unless the
// goroutine asked for a panic instead. Open therefore checks both meta pages and the
// file size against the one bbolt would use before it hands the file to bbolt, and
// every transaction runs with debug.SetPanicOnFault and a recover. Either way a damaged
// index is an error wrapping ErrDamaged that names the file. Only a memory fault or a
// panic bbolt raises itself counts as damage; any other panic in a transaction is a bug
// of the code it runs and is re-panicked, since damage's remedy would rebuild a sound
// index; MoveAside puts the file
// aside for the operator, and Init then Verify with Repair rebuild the index from the
// output files.
package checkpoint
