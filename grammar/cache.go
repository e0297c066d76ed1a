package grammar

import "github.com/mkserve/mkserve/internal/lru"

// Cache keeps compiled schemas, regular expressions and grammars by their
// source (a bounded LRU; safe for concurrent use). Compiled forms are
// read-only and shared by every validator made from them, so a request
// that sends what an earlier one sent — an agent's tools each turn, a
// service's one response schema — skips compiling, and a Regex keeps the
// plain-token masks its DFA states have cost (mask.go) across requests.
// Errors are not kept.
type Cache struct {
	lru *lru.Cache[cacheKey, any]
}

type cacheKey struct {
	kind byte // 's' schema, 'r' regex, 'g' grammar
	src  string
}

// NewCache keeps up to limit compiled sources.
func NewCache(limit int) *Cache { return &Cache{lru: lru.New[cacheKey, any](limit)} }

// Shared is the servers' cache: 64 sources. (A kept Regex keeps up to
// maxPlainMasks masks of the vocabulary — 19 KB each at 152k tokens — so
// the cache's worst case is about 300 MB; in practice a few patterns visit
// a few dozen DFA states.)
var Shared = NewCache(64)

// maxCachedSource is the longest source a Cache keeps (longer ones are
// compiled each time: the cache's memory stays bounded).
const maxCachedSource = 64 << 10

// get is the compiled k, compiling it with compile on a miss (outside any
// lock: two requests may compile one source at once, and the first kept
// wins).
func (c *Cache) get(k cacheKey, compile func() (any, error)) (any, error) {
	if len(k.src) > maxCachedSource {
		return compile()
	}
	if v, ok := c.lru.Get(k); ok {
		return v, nil
	}
	v, err := compile()
	if err != nil {
		return nil, err
	}
	return c.lru.Add(k, v), nil
}

// Schema is CompileSchema(raw), kept.
func (c *Cache) Schema(raw []byte) (*Schema, error) {
	v, err := c.get(cacheKey{'s', string(raw)}, func() (any, error) { return CompileSchema(raw) })
	if err != nil {
		return nil, err
	}
	return v.(*Schema), nil
}

// Regex is CompileRegex(pattern), kept.
func (c *Cache) Regex(pattern string) (*Regex, error) {
	v, err := c.get(cacheKey{'r', pattern}, func() (any, error) { return CompileRegex(pattern) })
	if err != nil {
		return nil, err
	}
	return v.(*Regex), nil
}

// Grammar is CompileGrammar(src), kept.
func (c *Cache) Grammar(src string) (*Grammar, error) {
	v, err := c.get(cacheKey{'g', src}, func() (any, error) { return CompileGrammar(src) })
	if err != nil {
		return nil, err
	}
	return v.(*Grammar), nil
}

// Len is how many compiled sources the cache holds.
func (c *Cache) Len() int { return c.lru.Len() }
