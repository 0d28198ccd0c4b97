// Package dataset reads a job's JSONL dataset: it checks every line, fingerprints the
// file, keeps a line index (cached in state_dir) and refuses a file changed under the job.
package dataset
