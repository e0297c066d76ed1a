package lru

import (
	"sync"
	"testing"
)

func TestCache(t *testing.T) {
	c := New[string, int](2)
	if got := c.Add("a", 1); got != 1 {
		t.Fatalf("Add a = %d", got)
	}
	if got := c.Add("a", 9); got != 1 {
		t.Errorf("Add over a kept value returned %d, want the first (1)", got)
	}
	c.Add("b", 2)
	c.Get("a") // a is now more recent than b
	c.Add("c", 3)
	if _, ok := c.Get("b"); ok {
		t.Error("b (least recently used) kept past the limit")
	}
	if v, ok := c.Get("a"); !ok || v != 1 || c.Len() != 2 {
		t.Errorf("a = %d %v, len %d", v, ok, c.Len())
	}
	if !c.Remove("a") || c.Remove("a") || c.Len() != 1 {
		t.Error("Remove")
	}
	if z := New[int, int](0); z.Add(1, 1) != 1 || z.Len() != 0 {
		t.Error("a zero-limit cache kept an entry")
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 100 {
				c.Add(string(rune('a'+(i+j)%5)), j)
				c.Get("c")
			}
		}()
	}
	wg.Wait()
	if c.Len() != 2 {
		t.Errorf("len %d after concurrent use", c.Len())
	}
}

func TestSized(t *testing.T) {
	c := NewSized[string, string](10, 10, func(v string) int64 { return int64(len(v)) })
	c.Add("a", "1234")
	c.Add("b", "1234")
	c.Get("a")
	c.Add("c", "123") // 11 bytes: b (least recently used) goes
	if _, ok := c.Get("b"); ok || c.Bytes() != 7 || c.Len() != 2 {
		t.Errorf("b kept %v, %d bytes, %d entries", ok, c.Bytes(), c.Len())
	}
	c.Add("big", "12345678901") // larger than the limit: nothing else survives, nor it
	if c.Len() != 0 || c.Bytes() != 0 {
		t.Errorf("%d entries, %d bytes after an oversized entry", c.Len(), c.Bytes())
	}
	c.Add("d", "12")
	if !c.Remove("d") || c.Bytes() != 0 {
		t.Errorf("Remove left %d bytes", c.Bytes())
	}
}
