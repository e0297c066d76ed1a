// Package lru is a bounded map that drops its least recently used entry
// first, safe for concurrent use.
package lru

import (
	"container/list"
	"sync"
)

// Cache holds up to a limit of entries.
type Cache[K comparable, V any] struct {
	mu    sync.Mutex
	limit int
	order *list.List // of *entry, most recently used first
	byKey map[K]*list.Element
}

type entry[K comparable, V any] struct {
	k K
	v V
}

// New is an empty cache of up to limit entries (0: it keeps none).
func New[K comparable, V any](limit int) *Cache[K, V] {
	return &Cache[K, V]{limit: max(limit, 0), order: list.New(), byKey: map[K]*list.Element{}}
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
	c.byKey[k] = c.order.PushFront(&entry[K, V]{k, v})
	for c.order.Len() > c.limit {
		old := c.order.Remove(c.order.Back()).(*entry[K, V])
		delete(c.byKey, old.k)
	}
	return v
}

// Remove drops k and reports whether it was kept.
func (c *Cache[K, V]) Remove(k K) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[k]
	if ok {
		c.order.Remove(el)
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
