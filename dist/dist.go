// Package dist runs one model over a world of processes: rank 0 (the
// leader) serves requests with the engine, and every other rank (a worker)
// mirrors the leader's model and KV-cache calls step by step on its own
// backend, so that the collective parts of a step (expert-parallel MoE
// exchanges over a transport.Comm) find every rank in the same place.
//
// The leader broadcasts each call before running it itself: InitKV,
// CopyBlocks and FreeSequence on the backend, and Forward on the model.
// Workers run the same call on their replica (attention and dense layers
// are replicated; each rank's MoE layers hold only its experts) and discard
// the logits. A worker that fails stops; the leader's next exchange with it
// fails, and the engine fails that step's requests instead of hanging.
package dist

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/models"
	"github.com/mkserve/mkserve/transport"
)

// Message kinds.
const (
	msgStop byte = iota + 1
	msgInitKV
	msgForward
	msgCopyBlocks
	msgFreeSequence
	msgAllocKV
)

// Timeout bounds one broadcast: a worker that does not take part within it
// fails the call. The first broadcast (the engine's InitKV, while workers
// may still be loading the checkpoint) gets FirstTimeout instead.
var (
	Timeout      = 60 * time.Second
	FirstTimeout = 10 * time.Minute
)

// Leader is rank 0's side: it wraps the model and the backend the engine
// uses so that every call is broadcast to the workers first.
type Leader struct {
	comm   transport.Comm
	mu     sync.Mutex
	sent   int   // broadcasts so far
	err    error // the first failed broadcast: the world is gone
	onFail func(error)
	// sentStep is the batch GraphStep has broadcast already: the model's
	// Forward inside that step (run, captured or checked against a replay)
	// does not broadcast it again.
	sentStep *backend.Batch
}

// OnFail registers f to run once, with the error, when a broadcast first
// fails: the world is broken from then on (a worker stopped or is
// unreachable), and every later call fails too. The server uses it to
// report itself unhealthy.
func (l *Leader) OnFail(f func(error)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.onFail = f
}

// Err is the error that broke the world, or nil.
func (l *Leader) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// NewLeader returns rank 0's leader over comm (which must be rank 0).
func NewLeader(comm transport.Comm) (*Leader, error) {
	if comm.Rank() != 0 {
		return nil, fmt.Errorf("dist: the leader is rank 0, this is rank %d", comm.Rank())
	}
	return &Leader{comm: comm}, nil
}

// broadcast sends msg to every worker (an exchange every rank takes part in).
func (l *Leader) broadcast(msg []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	send := make([][]float32, l.comm.Size())
	p := pack(msg)
	for r := 1; r < len(send); r++ {
		send[r] = p
	}
	tmo := Timeout
	if l.sent == 0 {
		tmo = FirstTimeout
	}
	l.sent++
	ctx, cancel := context.WithTimeout(context.Background(), tmo)
	defer cancel()
	_, err := l.comm.AllToAllV(ctx, send)
	if err != nil {
		err = fmt.Errorf("dist: broadcasting to %d workers: %w", l.comm.Size()-1, err)
		if l.err == nil {
			l.err = err
			if l.onFail != nil {
				go l.onFail(err) // not under l.mu
			}
		}
		return err
	}
	return nil
}

// Stop tells the workers to return from Work.
func (l *Leader) Stop() error { return l.broadcast([]byte{msgStop}) }

// Model wraps m: Forward is broadcast, then run.
func (l *Leader) Model(m models.Model) models.Model { return &leaderModel{Model: m, l: l} }

type leaderModel struct {
	models.Model
	l *Leader
}

func (m *leaderModel) Forward(b *backend.Batch) (backend.Tensor, error) {
	m.l.mu.Lock()
	sent := m.l.sentStep == b
	m.l.mu.Unlock()
	if !sent {
		if err := m.l.broadcast(encodeBatch(b)); err != nil {
			return nil, err
		}
	}
	return m.Model.Forward(b)
}

// Backend wraps be: InitKV, AllocKV, CopyBlocks and FreeSequence are
// broadcast, then run; the expert counters (backend.ExpertCounter) are the
// leader's own. When be samples on the device (backend.Sampler), so does
// the wrapper, on the leader alone (the workers' logits are discarded):
// until 2026-11-29 the wrapper hid Sample, and a world's engine copied
// every step's whole logits to the host (66 MB a step at batch 128 of a
// 129k vocabulary: 164 ms steps where the GPU took 26).
func (l *Leader) Backend(be backend.Backend) backend.Backend {
	lb := &leaderBackend{Backend: be, l: l}
	if s, ok := be.(backend.Sampler); ok {
		return &leaderSampler{leaderBackend: lb, s: s}
	}
	return lb
}

type leaderBackend struct {
	backend.Backend
	l *Leader
}

// leaderSampler is a leaderBackend whose backend samples on the device.
type leaderSampler struct {
	*leaderBackend
	s backend.Sampler
}

// Sample implements backend.Sampler with the leader's backend alone.
func (b *leaderSampler) Sample(logits backend.Tensor, rows []backend.SampleRow) []backend.SampleResult {
	return b.s.Sample(logits, rows)
}

var (
	_ backend.ExpertCounter = (*leaderBackend)(nil)
	_ backend.GraphWarmer   = (*leaderBackend)(nil)
	_ backend.KVAllocator   = (*leaderBackend)(nil)
	_ backend.Sampler       = (*leaderSampler)(nil)
)

// GraphStep broadcasts the step, then runs it through the wrapped
// backend's GraphStep (backend.StepGrapher: CUDA graphs), where f, the
// leader model's Forward, does not broadcast it again: a replayed graph
// runs no host code of the model, so the broadcast must come first. The
// workers run every step through their own GraphStep (backend.RunStep), so
// every rank captures and replays alike. Without a StepGrapher it is f().
func (b *leaderBackend) GraphStep(bt *backend.Batch, f func() (backend.Tensor, error)) (backend.Tensor, error) {
	sg, ok := b.Backend.(backend.StepGrapher)
	if !ok {
		return f()
	}
	if err := b.l.broadcast(encodeBatch(bt)); err != nil {
		return nil, err
	}
	b.l.mu.Lock()
	b.l.sentStep = bt
	b.l.mu.Unlock()
	defer func() {
		b.l.mu.Lock()
		b.l.sentStep = nil
		b.l.mu.Unlock()
	}()
	return sg.GraphStep(bt, f)
}

// GraphWarmupRows is the wrapped backend's (backend.GraphWarmer), or none.
func (b *leaderBackend) GraphWarmupRows(maxRows int) []int {
	if w, ok := b.Backend.(backend.GraphWarmer); ok {
		return w.GraphWarmupRows(maxRows)
	}
	return nil
}

func (b *leaderBackend) InitKV(blockSize, numBlocks int) error {
	msg := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64([]byte{msgInitKV}, uint64(blockSize)), uint64(numBlocks))
	if err := b.l.broadcast(msg); err != nil {
		return err
	}
	return b.Backend.InitKV(blockSize, numBlocks)
}

// KVElemBytes implements backend.KVAllocator: the wrapped backend's, or 4
// (float32, what the engine assumes of a backend that does not say).
func (b *leaderBackend) KVElemBytes() int {
	if a, ok := b.Backend.(backend.KVAllocator); ok {
		return a.KVElemBytes()
	}
	return 4
}

// AllocKV implements backend.KVAllocator: broadcast, then the wrapped
// backend's AllocKV (every rank holds the whole cache: attention is
// replicated), or nothing where it allocates layer by layer at first use.
func (b *leaderBackend) AllocKV(widths []backend.KVWidth) error {
	if err := b.l.broadcast(encodeWidths(widths)); err != nil {
		return err
	}
	if a, ok := b.Backend.(backend.KVAllocator); ok {
		return a.AllocKV(widths)
	}
	return nil
}

func (b *leaderBackend) CopyBlocks(src, dst []int32) {
	msg := appendInts(appendInts([]byte{msgCopyBlocks}, src), dst)
	if err := b.l.broadcast(msg); err != nil {
		panic(err.Error()) // the engine turns an op panic into a failed step
	}
	b.Backend.CopyBlocks(src, dst)
}

func (b *leaderBackend) FreeSequence(id uint64) {
	if err := b.l.broadcast(binary.LittleEndian.AppendUint64([]byte{msgFreeSequence}, id)); err != nil {
		panic(err.Error())
	}
	b.Backend.FreeSequence(id)
}

// TakeExpertLoad returns the leader's own backend's counts (nil when it
// counts none). Every rank routes the same tokens, so they are the world's.
func (b *leaderBackend) TakeExpertLoad() map[int][]int64 {
	if c, ok := b.Backend.(backend.ExpertCounter); ok {
		return c.TakeExpertLoad()
	}
	return nil
}

// Work runs a worker rank until the leader stops it (nil) or the world
// fails (the error): it receives each call the leader broadcasts and runs
// it on m and be.
func Work(ctx context.Context, comm transport.Comm, m models.Model, be backend.Backend) error {
	if comm.Rank() == 0 {
		return errors.New("dist: rank 0 is the leader, not a worker")
	}
	empty := make([][]float32, comm.Size())
	for {
		recv, err := comm.AllToAllV(ctx, empty)
		if err != nil {
			return fmt.Errorf("dist: rank %d waiting for the leader: %w", comm.Rank(), err)
		}
		msg := unpack(recv[0])
		if len(msg) == 0 {
			return fmt.Errorf("dist: rank %d: empty message from the leader", comm.Rank())
		}
		if err := run(msg, m, be); err != nil {
			return fmt.Errorf("dist: rank %d: %w", comm.Rank(), err)
		}
		if msg[0] == msgStop {
			return nil
		}
	}
}

// run executes one message, turning a backend panic into an error.
func run(msg []byte, m models.Model, be backend.Backend) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("call %d panicked: %v", msg[0], r)
		}
	}()
	body := msg[1:]
	switch msg[0] {
	case msgStop:
		return nil
	case msgInitKV:
		if len(body) != 16 {
			return fmt.Errorf("InitKV message of %d bytes", len(msg))
		}
		return be.InitKV(int(binary.LittleEndian.Uint64(body)), int(binary.LittleEndian.Uint64(body[8:])))
	case msgForward:
		b, err := decodeBatch(body)
		if err != nil {
			return err
		}
		// Through the backend's GraphStep, as the leader's engine runs it.
		_, err = backend.RunStep(be, b, func() (backend.Tensor, error) { return m.Forward(b) })
		return err
	case msgAllocKV:
		widths, err := decodeWidths(body)
		if err != nil {
			return err
		}
		if a, ok := be.(backend.KVAllocator); ok {
			return a.AllocKV(widths)
		}
		return nil
	case msgCopyBlocks:
		src, rest, err := readInts(body)
		if err != nil {
			return err
		}
		dst, rest, err := readInts(rest)
		if err != nil || len(rest) != 0 {
			return fmt.Errorf("CopyBlocks message: %v (%d bytes left)", err, len(rest))
		}
		be.CopyBlocks(src, dst)
		return nil
	case msgFreeSequence:
		if len(body) != 8 {
			return fmt.Errorf("FreeSequence message of %d bytes", len(msg))
		}
		be.FreeSequence(binary.LittleEndian.Uint64(body))
		return nil
	}
	return fmt.Errorf("unknown message kind %d", msg[0])
}

// encodeWidths is [msgAllocKV] then (layer, k, v) of every width.
func encodeWidths(widths []backend.KVWidth) []byte {
	v := make([]int32, 0, 3*len(widths))
	for _, w := range widths {
		v = append(v, int32(w.Layer), int32(w.K), int32(w.V))
	}
	return appendInts([]byte{msgAllocKV}, v)
}

// decodeWidths reverses encodeWidths (without the kind byte).
func decodeWidths(p []byte) ([]backend.KVWidth, error) {
	v, rest, err := readInts(p)
	if err != nil || len(rest) != 0 || len(v)%3 != 0 {
		return nil, fmt.Errorf("AllocKV message: %v (%d ints, %d bytes left)", err, len(v), len(rest))
	}
	out := make([]backend.KVWidth, len(v)/3)
	for i := range out {
		out[i] = backend.KVWidth{Layer: int(v[3*i]), K: int(v[3*i+1]), V: int(v[3*i+2])}
	}
	return out, nil
}

// encodeBatch is [msgForward] then the batch: tokens, positions, logit rows
// (length −1 for nil), spans (id, offset, len, past, context-parallel
// ranks, block table).
func encodeBatch(b *backend.Batch) []byte {
	out := appendInts([]byte{msgForward}, b.Tokens)
	out = appendInts(out, b.Positions)
	if b.LogitRows == nil {
		out = binary.LittleEndian.AppendUint32(out, math.MaxUint32)
	} else {
		rows := make([]int32, len(b.LogitRows))
		for i, r := range b.LogitRows {
			rows[i] = int32(r)
		}
		out = appendInts(out, rows)
	}
	out = binary.LittleEndian.AppendUint32(out, uint32(len(b.Seqs)))
	for _, s := range b.Seqs {
		out = binary.LittleEndian.AppendUint64(out, s.ID)
		out = appendInts(out, []int32{int32(s.Offset), int32(s.Len), int32(s.Past), int32(s.ContextParallel)})
		if s.Blocks == nil {
			out = binary.LittleEndian.AppendUint32(out, math.MaxUint32)
		} else {
			out = appendInts(out, s.Blocks)
		}
	}
	return out
}

func decodeBatch(p []byte) (*backend.Batch, error) {
	b := &backend.Batch{}
	var err error
	if b.Tokens, p, err = readInts(p); err != nil {
		return nil, fmt.Errorf("batch tokens: %w", err)
	}
	if b.Positions, p, err = readInts(p); err != nil {
		return nil, fmt.Errorf("batch positions: %w", err)
	}
	var rows []int32
	if rows, p, err = readIntsOrNil(p); err != nil {
		return nil, fmt.Errorf("batch logit rows: %w", err)
	}
	if rows != nil {
		b.LogitRows = make([]int, len(rows))
		for i, r := range rows {
			b.LogitRows[i] = int(r)
		}
	}
	if len(p) < 4 {
		return nil, errors.New("batch: no span count")
	}
	n := int(binary.LittleEndian.Uint32(p))
	p = p[4:]
	if n > len(p)/8 {
		return nil, fmt.Errorf("batch: %d spans in %d bytes", n, len(p))
	}
	for range n {
		if len(p) < 8 {
			return nil, errors.New("batch: truncated span")
		}
		s := backend.SeqSpan{ID: binary.LittleEndian.Uint64(p)}
		var f []int32
		if f, p, err = readInts(p[8:]); err != nil || len(f) != 4 {
			return nil, fmt.Errorf("batch span fields: %v (%d)", err, len(f))
		}
		s.Offset, s.Len, s.Past, s.ContextParallel = int(f[0]), int(f[1]), int(f[2]), int(f[3])
		if s.Blocks, p, err = readIntsOrNil(p); err != nil {
			return nil, fmt.Errorf("batch block table: %w", err)
		}
		b.Seqs = append(b.Seqs, s)
	}
	if len(p) != 0 {
		return nil, fmt.Errorf("batch: %d bytes left over", len(p))
	}
	return b, b.Validate()
}

// appendInts appends a length and the values, little-endian.
func appendInts(out []byte, v []int32) []byte {
	out = binary.LittleEndian.AppendUint32(out, uint32(len(v)))
	for _, x := range v {
		out = binary.LittleEndian.AppendUint32(out, uint32(x))
	}
	return out
}

// readInts reads what appendInts wrote.
func readInts(p []byte) ([]int32, []byte, error) {
	v, rest, err := readIntsOrNil(p)
	if err == nil && v == nil {
		return nil, nil, errors.New("missing list")
	}
	return v, rest, err
}

// readIntsOrNil is readInts where a length of MaxUint32 means nil.
func readIntsOrNil(p []byte) ([]int32, []byte, error) {
	if len(p) < 4 {
		return nil, nil, errors.New("truncated length")
	}
	n := binary.LittleEndian.Uint32(p)
	p = p[4:]
	if n == math.MaxUint32 {
		return nil, p, nil
	}
	if uint64(n)*4 > uint64(len(p)) {
		return nil, nil, fmt.Errorf("list of %d in %d bytes", n, len(p))
	}
	v := make([]int32, n)
	for i := range v {
		v[i] = int32(binary.LittleEndian.Uint32(p[4*i:]))
	}
	return v, p[4*n:], nil
}

// pack carries bytes in float32 words (the Comm's payload): the length,
// then the bytes four to a word.
func pack(b []byte) []float32 {
	out := make([]float32, 1+(len(b)+3)/4)
	out[0] = math.Float32frombits(uint32(len(b)))
	for i := 0; i < len(b); i += 4 {
		var w [4]byte
		copy(w[:], b[i:])
		out[1+i/4] = math.Float32frombits(binary.LittleEndian.Uint32(w[:]))
	}
	return out
}

// unpack reverses pack (nil for a malformed payload).
func unpack(p []float32) []byte {
	if len(p) == 0 {
		return nil
	}
	n := int(math.Float32bits(p[0]))
	if n > 4*(len(p)-1) {
		return nil
	}
	out := make([]byte, 4*(len(p)-1))
	for i, w := range p[1:] {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(w))
	}
	return out[:n]
}
