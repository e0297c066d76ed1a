// Package engine turns requests into forward steps: a step loop with
// continuous batching (decodes first, then prompt chunks, within a token
// budget), a paged KV-cache block manager with prefix caching and
// preemption, the sampler (on the device through backend.Sampler, else on
// the host), streaming detokenization with stop strings, and overlapped
// decode (overlap.go: the next step is launched while the previous step's
// tokens are still on the device). engine.Greedy is the single-sequence
// reference decoder the tests compare against.
package engine
