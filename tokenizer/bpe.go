package tokenizer

import (
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	sugar "github.com/sugarme/tokenizer"
)

// bpeCacheCap bounds the word cache of a BPE model (as HF's default), and
// bpeCacheMaxWord keeps long words (whole texts, without a pre-tokenizer)
// out of it.
const (
	bpeCacheCap     = 10000
	bpeCacheMaxWord = 256
)

// maxTokenID bounds token ids (the id table is dense; real vocabularies
// stay far below this).
const maxTokenID = 1 << 25

// bpeModel is a byte-pair-encoding model with the semantics of HF
// tokenizers' BPE (merges applied by rank then leftmost position, unknown
// characters to byte-fallback tokens or a (fused) unk token, ignore_merges,
// continuing-subword prefix and end-of-word suffix). It implements sugarme's
// tokenizer.Model so it can be plugged into a sugarme pipeline: sugarme's own
// BPE breaks merge ties arbitrarily, panics on unknown characters without an
// unk token and has no byte fallback.
type bpeModel struct {
	vocab  map[string]int32
	vocabR []string // by id; "" where absent (see hasID)
	hasID  []bool
	merges map[uint64]bpeMerge // key: left<<32 | right

	unkID        int32 // -1 if none
	unkToken     string
	prefix       string // continuing_subword_prefix
	suffix       string // end_of_word_suffix
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	byteIDs      [256]int32 // ids of <0xXX>, -1 where absent

	mu    sync.RWMutex
	cache map[string][]int32
}

type bpeMerge struct {
	rank  int32
	newID int32
}

func mergeKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// newBPE builds a model from a vocabulary and ordered merges (pairs of token
// strings). where names the source for error messages.
func newBPE(where string, vocab map[string]int32, merges [][2]string, unk string, prefix, suffix string,
	fuseUnk, byteFallback, ignoreMerges bool) (*bpeModel, error) {
	m := &bpeModel{
		vocab:        vocab,
		merges:       make(map[uint64]bpeMerge, len(merges)),
		unkID:        -1,
		unkToken:     unk,
		prefix:       prefix,
		suffix:       suffix,
		fuseUnk:      fuseUnk,
		byteFallback: byteFallback,
		ignoreMerges: ignoreMerges,
		cache:        make(map[string][]int32),
	}
	maxID := int32(-1)
	for _, id := range vocab {
		if id > maxID {
			maxID = id
		}
	}
	if maxID >= maxTokenID {
		return nil, fmt.Errorf("%s: model.vocab: id %d is beyond the supported %d", where, maxID, maxTokenID-1)
	}
	m.vocabR = make([]string, maxID+1)
	m.hasID = make([]bool, maxID+1)
	for tok, id := range vocab {
		if m.hasID[id] {
			// HF keeps one of them (hash-map order); refuse instead of guessing.
			return nil, fmt.Errorf("%s: model.vocab: id %d is used by both %q and %q", where, id, m.vocabR[id], tok)
		}
		m.vocabR[id] = tok
		m.hasID[id] = true
	}
	if unk != "" {
		if id, ok := vocab[unk]; ok {
			m.unkID = id
		}
		// HF only fails when an unknown character actually needs the unk
		// token; we do the same in tokenize.
	}
	for b := 0; b < 256; b++ {
		m.byteIDs[b] = -1
		if id, ok := vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.byteIDs[b] = id
		}
	}
	for rank, p := range merges {
		a, ok := vocab[p[0]]
		if !ok {
			return nil, fmt.Errorf("%s: model.merges[%d]: token %q is not in the vocabulary", where, rank, p[0])
		}
		b, ok := vocab[p[1]]
		if !ok {
			return nil, fmt.Errorf("%s: model.merges[%d]: token %q is not in the vocabulary", where, rank, p[1])
		}
		right := p[1]
		if prefix != "" {
			if !strings.HasPrefix(right, prefix) {
				return nil, fmt.Errorf("%s: model.merges[%d]: %q does not start with the continuing_subword_prefix %q", where, rank, right, prefix)
			}
			right = right[len(prefix):]
		}
		n, ok := vocab[p[0]+right]
		if !ok {
			return nil, fmt.Errorf("%s: model.merges[%d]: merged token %q is not in the vocabulary", where, rank, p[0]+right)
		}
		// Later duplicates overwrite earlier ones, as HF's HashMap collect does.
		m.merges[mergeKey(a, b)] = bpeMerge{rank: int32(rank), newID: n}
	}
	return m, nil
}

// tokenize returns the ids of one pre-tokenized word.
func (m *bpeModel) tokenize(w string) ([]int32, error) {
	if w == "" {
		return nil, nil
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[w]; ok {
			return []int32{id}, nil
		}
	}
	m.mu.RLock()
	ids, ok := m.cache[w]
	m.mu.RUnlock()
	if ok {
		return ids, nil
	}
	ids, err := m.mergeWord(w)
	if err != nil {
		return nil, err
	}
	if len(w) <= bpeCacheMaxWord {
		m.mu.Lock()
		if len(m.cache) < bpeCacheCap {
			m.cache[w] = ids
		}
		m.mu.Unlock()
	}
	return ids, nil
}

// bpeWord is the symbol list of one word during merging: a doubly linked
// list over parallel arrays; len 0 marks a symbol merged into its left
// neighbour.
type bpeWord struct {
	c, prev, next, size []int32
}

func (w *bpeWord) add(id int32, size int) {
	n := int32(len(w.c))
	if n > 0 {
		w.next[n-1] = n
	}
	w.c = append(w.c, id)
	w.prev = append(w.prev, n-1)
	w.next = append(w.next, -1)
	w.size = append(w.size, int32(size))
}

func (m *bpeModel) mergeWord(s string) ([]int32, error) {
	w := bpeWord{}
	unkID, unkLen := int32(-1), 0
	hasUnk := false
	flushUnk := func() {
		if hasUnk {
			w.add(unkID, unkLen)
			hasUnk = false
		}
	}
	for i := 0; i < len(s); {
		_, n := utf8.DecodeRuneInString(s[i:])
		piece := s[i : i+n]
		isFirst, isLast := i == 0, i+n == len(s)
		i += n
		key := piece
		if !isFirst && m.prefix != "" {
			key = m.prefix + key
		}
		if isLast && m.suffix != "" {
			key += m.suffix
		}
		if id, ok := m.vocab[key]; ok {
			flushUnk()
			w.add(id, n)
			continue
		}
		if m.byteFallback {
			ok := true
			for j := 0; j < len(key); j++ {
				if m.byteIDs[key[j]] < 0 {
					ok = false
					break
				}
			}
			if ok {
				// As HF: byte tokens are added without flushing a pending unk.
				for j := 0; j < len(key); j++ {
					w.add(m.byteIDs[key[j]], 1)
				}
				continue
			}
		}
		if m.unkToken == "" {
			continue // HF silently drops characters it cannot represent
		}
		if m.unkID < 0 {
			return nil, fmt.Errorf("unk token %q is not in the vocabulary", m.unkToken)
		}
		if hasUnk && m.fuseUnk {
			unkLen += n
			continue
		}
		flushUnk()
		unkID, unkLen, hasUnk = m.unkID, n, true
	}
	flushUnk()
	m.mergeAll(&w)
	out := make([]int32, 0, len(w.c))
	for i, c := range w.c {
		if w.size[i] != 0 {
			out = append(out, c)
		}
	}
	return out, nil
}

// mergeItem is a candidate merge of the symbol at pos with its right
// neighbour.
type mergeItem struct {
	rank, pos, newID int32
}

func (a mergeItem) less(b mergeItem) bool {
	if a.rank != b.rank {
		return a.rank < b.rank
	}
	return a.pos < b.pos
}

// mergeHeap is a binary min-heap of merge candidates ordered by (rank, pos).
type mergeHeap []mergeItem

func (h *mergeHeap) push(x mergeItem) {
	*h = append(*h, x)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s[i].less(s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *mergeHeap) pop() mergeItem {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(s) && s[l].less(s[m]) {
			m = l
		}
		if r < len(s) && s[r].less(s[m]) {
			m = r
		}
		if m == i {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// mergeAll applies merges lowest rank first, leftmost first among equal
// ranks, skipping stale candidates, exactly like HF's Word::merge_all.
func (m *bpeModel) mergeAll(w *bpeWord) {
	if len(w.c) < 2 || len(m.merges) == 0 {
		return
	}
	h := make(mergeHeap, 0, len(w.c))
	for i := 0; i+1 < len(w.c); i++ {
		if mg, ok := m.merges[mergeKey(w.c[i], w.c[i+1])]; ok {
			h.push(mergeItem{rank: mg.rank, pos: int32(i), newID: mg.newID})
		}
	}
	for len(h) > 0 {
		top := h.pop()
		p := top.pos
		if w.size[p] == 0 || w.next[p] == -1 {
			continue
		}
		nx := w.next[p]
		mg, ok := m.merges[mergeKey(w.c[p], w.c[nx])]
		if !ok || mg.newID != top.newID {
			continue // stale entry
		}
		w.c[p] = top.newID
		w.size[p] += w.size[nx]
		w.next[p] = w.next[nx]
		w.size[nx] = 0
		if nn := w.next[nx]; nn >= 0 {
			w.prev[nn] = p
		}
		if pv := w.prev[p]; pv >= 0 {
			if mg, ok := m.merges[mergeKey(w.c[pv], w.c[p])]; ok {
				h.push(mergeItem{rank: mg.rank, pos: pv, newID: mg.newID})
			}
		}
		if nn := w.next[p]; nn >= 0 {
			if mg, ok := m.merges[mergeKey(w.c[p], w.c[nn])]; ok {
				h.push(mergeItem{rank: mg.rank, pos: p, newID: mg.newID})
			}
		}
	}
}

// idToToken returns the token string of id in the model vocabulary.
func (m *bpeModel) idToToken(id int32) (string, bool) {
	if id < 0 || int(id) >= len(m.vocabR) || !m.hasID[id] {
		return "", false
	}
	return m.vocabR[id], true
}

var _ sugar.Model = (*bpeModel)(nil)

// Tokenize implements sugarme's tokenizer.Model: it tokenizes one
// pre-tokenized word, with byte offsets relative to it.
func (m *bpeModel) Tokenize(sequence string) ([]sugar.Token, error) {
	ids, err := m.tokenize(sequence)
	if err != nil {
		return nil, err
	}
	toks := make([]sugar.Token, len(ids))
	for i, id := range ids {
		v, _ := m.idToToken(id)
		toks[i] = sugar.Token{Id: int(id), Value: v}
	}
	return toks, nil
}

// TokenToId implements sugarme's tokenizer.Model.
func (m *bpeModel) TokenToId(token string) (int, bool) {
	id, ok := m.vocab[token]
	return int(id), ok
}

// IdToToken implements sugarme's tokenizer.Model.
func (m *bpeModel) IdToToken(id int) (string, bool) {
	if id < 0 || id > 1<<31-1 {
		return "", false
	}
	return m.idToToken(int32(id))
}

// GetVocab implements sugarme's tokenizer.Model (a copy of the vocabulary).
func (m *bpeModel) GetVocab() map[string]int {
	out := make(map[string]int, len(m.vocab))
	for k, v := range m.vocab {
		out[k] = int(v)
	}
	return out
}

// GetVocabSize implements sugarme's tokenizer.Model: the number of tokens
// in the vocabulary (as HF, not the largest id + 1).
func (m *bpeModel) GetVocabSize() int { return len(m.vocab) }

// Save implements sugarme's tokenizer.Model; saving is not supported.
func (m *bpeModel) Save(path string, prefixOpt ...string) error {
	return fmt.Errorf("tokenizer: saving a BPE model is not supported")
}
