// Package lru is a bounded map that drops its least recently used entry
// first, safe for concurrent use.
package lru

import (
	"container/list"
	"sync"
)

// Cache holds up to a limit of entries (and, made by NewSized, of their
// sizes added up).
type Cache[K comparable, V any] struct {
	mu       sync.Mutex
	limit    int
	maxBytes int64         // 0: no size limit
	sizeOf   func(V) int64 // nil: no size limit
	bytes    int64
	order    *list.List // of *entry, most recently used first
	byKey    map[K]*list.Element
}

type entry[K comparable, V any] struct {
	k    K
	v    V
	size int64
}

// New is an empty cache of up to limit entries (0: it keeps none).
func New[K comparable, V any](limit int) *Cache[K, V] {
	return &Cache[K, V]{limit: max(limit, 0), order: list.New(), byKey: map[K]*list.Element{}}
}

// NewSized is New whose entries' sizes (sizeOf) also add up to at most
// maxBytes: the least recently used go first until both limits hold (an
// entry larger than maxBytes is not kept).
func NewSized[K comparable, V any](limit int, maxBytes int64, sizeOf func(V) int64) *Cache[K, V] {
	c := New[K, V](limit)
	c.maxBytes, c.sizeOf = maxBytes, sizeOf
	return c
}

// Bytes is the entries' sizes added up (0 without NewSized).
func (c *Cache[K, V]) Bytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}

// Get is k's value, now the most recently used.
func (c *Cache[K, V]) Get(k K) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[k]
	if !ok {
		var zero V
		return zero, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*entry[K, V]).v, true
}

// Add keeps v for k unless k has a value already, and returns the value k
// now has; past the limit the least recently used entries go.
func (c *Cache[K, V]) Add(k K, v V) V {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[k]; ok {
		c.order.MoveToFront(el)
		return el.Value.(*entry[K, V]).v
	}
	e := &entry[K, V]{k: k, v: v}
	if c.sizeOf != nil {
		e.size = c.sizeOf(v)
	}
	c.byKey[k] = c.order.PushFront(e)
	c.bytes += e.size
	for c.order.Len() > c.limit || (c.sizeOf != nil && c.bytes > c.maxBytes) {
		old := c.order.Remove(c.order.Back()).(*entry[K, V])
		delete(c.byKey, old.k)
		c.bytes -= old.size
	}
	return v
}

// Remove drops k and reports whether it was kept.
func (c *Cache[K, V]) Remove(k K) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[k]
	if ok {
		c.bytes -= c.order.Remove(el).(*entry[K, V]).size
		delete(c.byKey, k)
	}
	return ok
}

// Len is the number of entries.
func (c *Cache[K, V]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}
