package grammar

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/mkserve/mkserve/tokenizer"
)

// TestCache: a source compiles once and is shared; errors are not kept;
// past the limit the least recently used goes; sources too long to keep
// still compile; concurrent use is safe (go test -race).
func TestCache(t *testing.T) {
	c := NewCache(3)
	s1, err := c.Schema([]byte(`{"type": "object"}`))
	if err != nil {
		t.Fatal(err)
	}
	if s2, _ := c.Schema([]byte(`{"type": "object"}`)); s2 != s1 {
		t.Error("the same schema compiled twice")
	}
	if _, err := c.Regex("("); err == nil || c.Len() != 1 {
		t.Errorf("bad regex: %v, %d kept", err, c.Len())
	}
	r1, _ := c.Regex("[a-z]+")
	g1, _ := c.Grammar(`root ::= "a"`)
	if _, err := c.Grammar(`root ::= x`); err == nil {
		t.Error("a bad grammar compiled")
	}
	c.Schema([]byte(`{"type": "object"}`)) // the schema is now the most recent: the regex is the oldest
	c.Grammar(`root ::= "b"`)
	if r2, _ := c.Regex("[a-z]+"); r2 == r1 || c.Len() != 3 {
		t.Errorf("the least recently used was not dropped (%d kept)", c.Len())
	}
	if g2, _ := c.Grammar(`root ::= "a"`); g2 == g1 {
		t.Error("grammar kept past the limit")
	}
	long := `{"type": "object", "description": "` + strings.Repeat("a", maxCachedSource) + `"}`
	if s, err := c.Schema([]byte(long)); err != nil || s == nil {
		t.Fatalf("long schema: %v", err)
	}
	if s, _ := c.Schema([]byte(long)); c.Len() != 3 || s == nil {
		t.Errorf("a long source was kept (%d)", c.Len())
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 50 {
				re, err := c.Regex(fmt.Sprintf("[a-z]{%d}", (i+j)%5+1))
				if err != nil || !re.New().Advance([]byte("a")) {
					t.Errorf("regex %d: %v", j, err)
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkRequestMask is a request's first mask inside a pattern-
// constrained string, over GPT-2's vocabulary: the schema compiled afresh
// (as every request did before the cache) against one kept by a Cache
// (the plain-token masks of its regex's DFA states kept too).
func BenchmarkRequestMask(b *testing.B) {
	tok, err := tokenizer.Load(gpt2Path)
	if err != nil {
		b.Skipf("GPT-2 tokenizer not available: %v", err)
	}
	v := NewVocab(tok.VocabSize(), tok.TokenBytes)
	dst := make([]uint64, v.MaskWords())
	raw := []byte(`{"type": "object", "properties": {"id": {"type": "string", "pattern": "[A-Za-z ]{2,40}-[0-9]+"}}, "required": ["id"]}`)
	for _, c := range []struct {
		name    string
		compile func() (*Schema, error)
	}{
		{"fresh", func() (*Schema, error) { return CompileSchema(raw) }},
		{"cached", func() (*Schema, error) { return cachedSchema(raw) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				s, err := c.compile()
				if err != nil {
					b.Fatal(err)
				}
				j := s.New()
				j.Advance([]byte(`{"id": "Zo`))
				v.Mask(j, dst)
			}
		})
	}
}

var benchCache = NewCache(4)

// cachedSchema is raw's schema from one benchmark cache.
func cachedSchema(raw []byte) (*Schema, error) { return benchCache.Schema(raw) }
