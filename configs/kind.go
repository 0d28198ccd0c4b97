package configs

// TransformersWindow is the transformers server's --window-requests default
// (sglang/hfserver/extract_hfserver/server.py): how many queued requests it sorts by
// prompt length at a time before cutting them into batches.
const TransformersWindow = 256

// InflightToFill is how many requests one server that sorts its queue in windows needs
// open for every window to fill. It answers a request only once its dump is written,
// and when it gathers the next window the last batches of the one before are still
// being written: those are a window's longest prompts, fewer requests each than
// batchRequests. Two batches' worth of headroom is what filled every window after the
// first two in the H200 runs (256 of 256 at 384 open; 204 to 227 at 256), and windows
// filled short pad more (docs/performance.md, round 4).
func InflightToFill(window, batchRequests int) int { return window + 2*batchRequests }

// applyKindDefaults sets the defaults that depend on server.kind, for keys given
// nowhere (set says whether key came from the file, env or a flag). Kind transformers:
// run.max_inflight fills every replica's sort window; the general default, 32, would
// hold each window to 32 requests, fewer than one batch of 64.
func (c *Config) applyKindDefaults(set func(key string) bool) {
	// This runs before Validate: the bounds keep an absurd replicas or
	// max_batch_requests from overflowing here, and Validate then names that key alone.
	if c.Server.Kind == "transformers" && !set("run.max_inflight") && c.Server.Replicas <= maxReplicas {
		perServer := InflightToFill(TransformersWindow, min(max(c.Server.Transformers.MaxBatchRequests, 0), maxInflight))
		c.Run.MaxInflight = min(c.replicas()*perServer, maxInflight)
	}
}
