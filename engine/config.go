package engine

import (
	"cmp"
	"fmt"
)

// Config sizes the engine. Zero fields take the defaults of DefaultConfig.
type Config struct {
	MaxNumSeqs          int   // running sequences per step at most (max_num_seqs)
	MaxNumBatchedTokens int   // tokens per step at most (max_num_batched_tokens)
	BlockSize           int   // tokens per KV-cache block
	KVCacheBytes        int64 // memory for the KV cache; sets the number of blocks
	MaxQueue            int   // waiting requests at most; beyond it Generate returns ErrQueueFull
	MaxModelLen         int   // prompt + completion tokens at most (0: the model's max_position_embeddings)
	PrefixCaching       bool  // share full prompt blocks among requests with the same prefix
	// HostSampling copies the logits to the host and samples there even
	// when the backend can sample on the device (backend.Sampler).
	HostSampling bool
	// ContextParallel > 1 prefills long prompts with ring attention over
	// that many context-parallel ranks (backend.SeqSpan.ContextParallel):
	// every prefill chunk of at least 2·ContextParallel tokens of a prompt
	// of at least ContextParallelMin tokens. 0 or 1: off.
	ContextParallel    int
	ContextParallelMin int // prompt tokens from which context parallelism applies (0: 4096)
	// RebalanceEvery > 0 re-places every MoE layer's experts on the
	// expert-parallel ranks every that many steps, from the expert loads the
	// backend counted (EPLB-style: hot experts get replicas, ranks get equal
	// work; moe.Rebalance); it needs a backend with expert parallelism
	// (backend.ExpertPlacer). 0: off.
	RebalanceEvery int
	// RebalanceSpare is the extra expert slots per rank that replicas of hot
	// experts may use (with RebalanceEvery; 0: 1).
	RebalanceSpare int
	// GraphWarmup captures the backend's decode graphs of every batch size
	// before serving (backend.GraphWarmer), so that no request pays for a
	// first eager step and a capture; New takes that long longer.
	GraphWarmup bool
	// SyncSteps turns overlapped decode off: every step waits for its
	// sampled tokens before the next is launched. By default, on a backend
	// that can keep them on the device (backend.AsyncSampler), a step whose
	// sequences sample without penalties, logit biases or a fork is launched
	// with the previous step's tokens still on the device, and the host
	// delivers those while the GPU runs (overlap.go).
	SyncSteps bool
	// SpeculativeTokens > 0 turns on prompt-lookup speculation (vLLM's
	// "ngram" speculative decoding): a decode step proposes up to that many
	// draft tokens — those that followed the most recent earlier occurrence
	// of the sequence's last tokens, in its prompt or output — verifies
	// them in the same forward pass and keeps those the model picks itself
	// (greedy, or sampled with its own draw at each position), plus its own
	// next token: the same output (greedy) or distribution (sampled) in
	// fewer steps when the text repeats (code edits, quoting, extraction).
	// Requests that ask for penalties, a bias, a grammar, min_tokens or
	// prompt log-probabilities decode as usual. A step with a request that qualifies runs
	// synchronously (drafts come from tokens on the host). 0: off.
	SpeculativeTokens int
	// SpeculativeNgramMax and SpeculativeNgramMin bound the length of the
	// suffix looked up, longest first (0: 4 and 2).
	SpeculativeNgramMax, SpeculativeNgramMin int
}

// DefaultConfig is what `mkserve serve` uses without flags on a CPU.
func DefaultConfig() Config {
	return Config{
		MaxNumSeqs:          256,
		MaxNumBatchedTokens: 2048,
		BlockSize:           16,
		KVCacheBytes:        1 << 30,
		MaxQueue:            1024,
		PrefixCaching:       true,
		GraphWarmup:         true,
		ContextParallel:     1,
		ContextParallelMin:  DefaultContextParallelMin,
	}
}

// withDefaults fills zero fields from DefaultConfig.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.MaxNumSeqs == 0 {
		c.MaxNumSeqs = d.MaxNumSeqs
	}
	if c.MaxNumBatchedTokens == 0 {
		c.MaxNumBatchedTokens = d.MaxNumBatchedTokens
	}
	if c.BlockSize == 0 {
		c.BlockSize = d.BlockSize
	}
	if c.KVCacheBytes == 0 {
		c.KVCacheBytes = d.KVCacheBytes
	}
	if c.MaxQueue == 0 {
		c.MaxQueue = d.MaxQueue
	}
	if c.ContextParallelMin == 0 {
		c.ContextParallelMin = DefaultContextParallelMin
	}
	if c.SpeculativeNgramMax == 0 {
		c.SpeculativeNgramMax = DefaultSpeculativeNgramMax
	}
	if c.SpeculativeNgramMin == 0 {
		c.SpeculativeNgramMin = min(2, c.SpeculativeNgramMax)
	}
	return c
}

// MaxSpeculativeTokens is the most draft tokens a step may verify per
// sequence; DefaultSpeculativeNgramMax the longest suffix looked up when
// SpeculativeNgramMax is 0.
const (
	MaxSpeculativeTokens       = 16
	DefaultSpeculativeNgramMax = 4
)

// DefaultContextParallelMin is the prompt length from which context
// parallelism applies when ContextParallelMin is 0.
const DefaultContextParallelMin = 4096

// Validate names the first field out of range.
func (c Config) Validate() error {
	switch {
	case c.MaxNumSeqs < 0:
		return fmt.Errorf("max_num_seqs must be positive, got %d", c.MaxNumSeqs)
	case c.MaxNumBatchedTokens < 0:
		return fmt.Errorf("max_num_batched_tokens must be positive, got %d", c.MaxNumBatchedTokens)
	case c.BlockSize < 0 || c.BlockSize > 1024:
		return fmt.Errorf("block_size must be in [1, 1024], got %d", c.BlockSize)
	case c.KVCacheBytes < 0:
		return fmt.Errorf("kv_cache_bytes must be positive, got %d", c.KVCacheBytes)
	case c.MaxQueue < 0:
		return fmt.Errorf("max_queue must be positive, got %d", c.MaxQueue)
	case c.MaxModelLen < 0:
		return fmt.Errorf("max_model_len must not be negative, got %d", c.MaxModelLen)
	case c.ContextParallel < 0 || c.ContextParallel > 64:
		return fmt.Errorf("context_parallel must be in [1, 64], got %d", c.ContextParallel)
	case c.ContextParallelMin < 0:
		return fmt.Errorf("context_parallel_min must not be negative, got %d", c.ContextParallelMin)
	case c.RebalanceEvery < 0:
		return fmt.Errorf("rebalance_every must not be negative, got %d", c.RebalanceEvery)
	case c.RebalanceSpare < 0:
		return fmt.Errorf("rebalance_spare must not be negative, got %d", c.RebalanceSpare)
	case c.SpeculativeTokens < 0 || c.SpeculativeTokens > MaxSpeculativeTokens:
		return fmt.Errorf("speculative_tokens must be in [0, %d], got %d", MaxSpeculativeTokens, c.SpeculativeTokens)
	case c.SpeculativeNgramMax < 0 || c.SpeculativeNgramMax > 64 || c.SpeculativeNgramMin < 0 ||
		c.SpeculativeNgramMin > cmp.Or(c.SpeculativeNgramMax, DefaultSpeculativeNgramMax):
		return fmt.Errorf("speculative n-gram lengths must satisfy 1 ≤ min ≤ max ≤ 64 (max 0: %d), got min %d max %d",
			DefaultSpeculativeNgramMax, c.SpeculativeNgramMin, c.SpeculativeNgramMax)
	}
	return nil
}
