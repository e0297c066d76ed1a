package engine

import (
	"container/list"
	"encoding/binary"
	"hash/maphash"
	"slices"
)

// blockManager owns the paged KV cache's blocks: reference counts, the free
// list, and the prefix cache (full, computed blocks keyed by a hash chained
// over their tokens, kept after release and evicted least recently used).
//
// It is used by the engine's step goroutine only; it has no lock.
type blockManager struct {
	blockSize int
	refs      []int32    // [numBlocks] holders of each block
	free      []int32    // ref 0, no cached content (stack)
	lru       *list.List // ref 0 with cached content, least recently used first
	lruElem   map[int32]*list.Element
	cached    map[uint64]int32    // content hash → block
	meta      map[int32]*blockKey // cached block → its key (to verify hits and evict)
	seed      maphash.Seed
	hits      int // prefix-cache tokens hit (cumulative)
	queries   int // prefix-cache tokens looked up (cumulative)
}

// blockKey identifies a full block's content: the hash of everything before
// it and its own tokens.
type blockKey struct {
	hash   uint64
	parent uint64
	tokens []int32
}

func newBlockManager(numBlocks, blockSize int) *blockManager {
	m := &blockManager{
		blockSize: blockSize, refs: make([]int32, numBlocks), lru: list.New(),
		lruElem: map[int32]*list.Element{}, cached: map[uint64]int32{}, meta: map[int32]*blockKey{},
		seed: maphash.MakeSeed(),
	}
	for b := numBlocks - 1; b >= 0; b-- {
		m.free = append(m.free, int32(b))
	}
	return m
}

// numBlocks is the pool size.
func (m *blockManager) numBlocks() int { return len(m.refs) }

// available is the number of blocks an allocation could take now.
func (m *blockManager) available() int { return len(m.free) + m.lru.Len() }

// usage is the fraction of blocks held by sequences.
func (m *blockManager) usage() float64 {
	return 1 - float64(m.available())/float64(len(m.refs))
}

// alloc takes a block: a never-cached one first, else the least recently
// used cached one (forgetting its content).
func (m *blockManager) alloc() (int32, bool) {
	var b int32
	switch {
	case len(m.free) > 0:
		b = m.free[len(m.free)-1]
		m.free = m.free[:len(m.free)-1]
	case m.lru.Len() > 0:
		e := m.lru.Front()
		b = m.lru.Remove(e).(int32)
		delete(m.lruElem, b)
		m.forget(b)
	default:
		return 0, false
	}
	m.refs[b] = 1
	return b, true
}

// forget drops b's prefix-cache entry.
func (m *blockManager) forget(b int32) {
	if k := m.meta[b]; k != nil {
		if m.cached[k.hash] == b {
			delete(m.cached, k.hash)
		}
		delete(m.meta, b)
	}
}

// release drops one reference; an unreferenced block keeps its cached
// content (evictable) or returns to the free list.
func (m *blockManager) release(b int32) {
	m.refs[b]--
	if m.refs[b] > 0 {
		return
	}
	if m.refs[b] < 0 {
		panic("engine: block released more often than held")
	}
	if _, ok := m.meta[b]; ok {
		m.lruElem[b] = m.lru.PushBack(b)
		return
	}
	m.free = append(m.free, b)
}

// releaseAll releases every block of a table.
func (m *blockManager) releaseAll(blocks []int32) {
	for _, b := range blocks {
		m.release(b)
	}
}

// share adds a reference to a held block (forking a sequence).
func (m *blockManager) share(b int32) { m.refs[b]++ }

// hashBlock chains parent with a block's tokens.
func (m *blockManager) hashBlock(parent uint64, tokens []int32) uint64 {
	var h maphash.Hash
	h.SetSeed(m.seed)
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], parent)
	h.Write(buf[:])
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(buf[:4], uint32(t))
		h.Write(buf[:4])
	}
	return h.Sum64()
}

// lookup finds the cached blocks that hold a prefix of tokens, taking a
// reference on each; it returns the blocks and their hash chain. At most
// limit tokens are matched. The caller records the lookup with countLookup
// once the sequence is admitted (a lookup undone for lack of memory and
// retried later must not count twice).
func (m *blockManager) lookup(tokens []int32, limit int) (blocks []int32, hashes []uint64) {
	bs := m.blockSize
	parent := uint64(0)
	for end := bs; end <= limit; end += bs {
		chunk := tokens[end-bs : end]
		h := m.hashBlock(parent, chunk)
		b, ok := m.cached[h]
		if !ok {
			break
		}
		k := m.meta[b]
		if k == nil || k.parent != parent || !slices.Equal(k.tokens, chunk) {
			break // hash collision: treat as a miss
		}
		if m.refs[b] == 0 {
			m.lru.Remove(m.lruElem[b])
			delete(m.lruElem, b)
		}
		m.refs[b]++
		blocks = append(blocks, b)
		hashes = append(hashes, h)
		parent = h
	}
	return blocks, hashes
}

// countLookup records an admitted sequence's prefix-cache lookup: limit
// tokens asked for (whole blocks), hit of them found.
func (m *blockManager) countLookup(limit, hit int) {
	m.queries += limit - limit%m.blockSize
	m.hits += hit
}

// commit records a held, full, computed block under its hash so later
// sequences can share it. A block whose content is already cached elsewhere
// stays uncached.
func (m *blockManager) commit(b int32, parent, hash uint64, tokens []int32) {
	if _, dup := m.cached[hash]; dup {
		return
	}
	if _, has := m.meta[b]; has {
		return
	}
	m.cached[hash] = b
	m.meta[b] = &blockKey{hash: hash, parent: parent, tokens: slices.Clone(tokens)}
}
