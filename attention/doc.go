// Package attention holds the CPU reference attention (causal prefill and
// decode over a KV history, GQA, sliding window, sinks; MLA runs through it
// with per-head expanded keys) and the rotary position embeddings of every
// supported family (NeoX halves, interleaved pairs, linear, llama3, YaRN).
package attention
