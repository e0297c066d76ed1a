// Package engine turns requests into forward steps: today a single-sequence
// generator (prefill, then one decode step per token, greedy sampling);
// continuous batching, the paged KV-cache manager and the full sampler
// build on the same Model/Backend boundary.
package engine
