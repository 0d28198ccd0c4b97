// Package doctor says whether a job could start on this node: Run judges the facts that
// sglang, checkpoint, shm, configs, dataset and the run loop report, and changes nothing.
package doctor
