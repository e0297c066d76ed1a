package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// GRPCConfig places one rank of a multi-process world. Rank 0 is the
// coordinator: it listens on Coordinator, and every other rank joins there
// with its own address; once all Size ranks have joined, each learns every
// peer's address and the world is up. One process per GPU runs one rank.
type GRPCConfig struct {
	Rank, Size  int
	Coordinator string // rank 0's host:port, which rank 0 listens on
	// Listen is this rank's own host:port (port 0 picks a free one);
	// ignored for rank 0, which listens on Coordinator.
	Listen string
	// Advertise is the address peers dial for this rank (default: the
	// address the listener got).
	Advertise string
	// JoinTimeout bounds the bootstrap (default 60 s).
	JoinTimeout time.Duration
}

// JoinGRPC starts this rank's transport server, joins the world through
// the coordinator and returns its Comm, whose AllToAllV moves payloads
// between processes over gRPC (loopback or the network). Close releases the
// server and connections. The bootstrap fails with a clear error when the
// sizes disagree, a rank joins twice, or the world is not complete within
// JoinTimeout.
func JoinGRPC(ctx context.Context, cfg GRPCConfig) (*GRPCComm, error) {
	if cfg.Size < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return nil, fmt.Errorf("transport: rank %d of %d: want 0 ≤ rank < size", cfg.Rank, cfg.Size)
	}
	if cfg.Coordinator == "" {
		return nil, errors.New("transport: no coordinator address")
	}
	if cfg.JoinTimeout <= 0 {
		cfg.JoinTimeout = 60 * time.Second
	}
	listen := cfg.Listen
	if cfg.Rank == 0 {
		listen = cfg.Coordinator
	}
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("transport: rank %d: listen on %s: %w", cfg.Rank, listen, err)
	}
	c := &GRPCComm{rank: cfg.Rank, size: cfg.Size, inbox: make([]chan grpcMsg, cfg.Size), done: make(chan struct{})}
	c.streamCtx, c.streamStop = context.WithCancel(context.Background())
	c.closing = make(chan struct{})
	for r := range c.inbox {
		c.inbox[r] = make(chan grpcMsg, 2) // at most one exchange ahead (see NewLocalWorld)
	}
	if cfg.Rank == 0 {
		c.coord = &coordinator{size: cfg.Size, addrs: make([]string, cfg.Size), full: make(chan struct{})}
	}
	c.srv = grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.MaxRecvMsgSize(math.MaxInt32))
	c.srv.RegisterService(&rankService, c)
	go c.srv.Serve(lis)
	self := cfg.Advertise
	if self == "" {
		self = lis.Addr().String()
	}
	jctx, cancel := context.WithTimeout(ctx, cfg.JoinTimeout)
	defer cancel()
	addrs, err := c.join(jctx, cfg.Coordinator, self)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("transport: rank %d of %d: joining at %s: %w", cfg.Rank, cfg.Size, cfg.Coordinator, err)
	}
	c.peers = make([]*grpc.ClientConn, cfg.Size)
	for r, a := range addrs {
		if r == cfg.Rank {
			continue
		}
		if c.peers[r], err = dial(a); err != nil {
			c.Close()
			return nil, fmt.Errorf("transport: rank %d: dialing rank %d at %s: %w", cfg.Rank, r, a, err)
		}
	}
	c.out = make([]chan []byte, cfg.Size)
	for r, p := range c.peers {
		if p != nil {
			c.out[r] = make(chan []byte, 2) // at most one exchange ahead, as the inboxes
			f := make(chan struct{})
			c.flushed = append(c.flushed, f)
			go c.send(r, p, c.out[r], f)
		}
	}
	return c, nil
}

// send streams rank r's puts in order over one client stream (opened at the
// first put): a put is one message on it, not a call with its own round
// trip. A failure aborts the world, which every waiting exchange sees. On
// Close it sends what is queued, ends the stream and waits for the peer's
// answer, which comes once the peer has taken every message (so that a
// last exchange, dist's stop, reaches it before the abort does).
func (c *GRPCComm) send(r int, p *grpc.ClientConn, q chan []byte, flushed chan struct{}) {
	defer close(flushed)
	var st grpc.ClientStream
	put := func(msg []byte) bool {
		if st == nil {
			var err error
			st, err = p.NewStream(c.streamCtx, &rankService.Streams[0], "/mkserve.transport.Rank/Stream",
				grpc.ForceCodec(rawCodec{}))
			if err != nil {
				c.abort(fmt.Errorf("transport: rank %d: opening the stream to rank %d: %w", c.rank, r, err))
				return false
			}
		}
		if err := st.SendMsg(&msg); err != nil {
			if err == io.EOF { // the peer ended the stream: its status says why
				err = st.RecvMsg(new([]byte))
			}
			c.abort(fmt.Errorf("transport: rank %d: sending to rank %d: %w", c.rank, r, err))
			return false
		}
		return true
	}
	for {
		select {
		case msg := <-q:
			if !put(msg) {
				return
			}
		case <-c.closing:
			for {
				select {
				case msg := <-q:
					if !put(msg) {
						return
					}
					continue
				default:
				}
				break
			}
			if st != nil && st.CloseSend() == nil {
				st.RecvMsg(new([]byte)) // the peer's answer: it has every message
			}
			return
		case <-c.done:
			return
		}
	}
}

// GRPCComm is a Comm between processes over gRPC.
type GRPCComm struct {
	rank, size int
	srv        *grpc.Server
	peers      []*grpc.ClientConn // [rank], nil for this rank
	out        []chan []byte      // [rank]: encoded puts, sent in order on one stream per peer (nil for this rank)
	streamCtx  context.Context    // the streams' lifetime: until Close
	streamStop context.CancelFunc
	closing    chan struct{}   // closed by Close: the senders flush and end their streams
	flushed    []chan struct{} // [rank]: closed when that sender has stopped
	coord      *coordinator    // rank 0 only
	inbox      []chan grpcMsg  // [source rank]
	seq        uint64          // exchanges made
	done       chan struct{}   // closed on abort
	once       sync.Once
	err        error
	closeOnce  sync.Once
}

var _ Comm = (*GRPCComm)(nil)

type grpcMsg struct {
	seq  uint64
	data []float32
}

// Rank implements Comm.
func (c *GRPCComm) Rank() int { return c.rank }

// Size implements Comm.
func (c *GRPCComm) Size() int { return c.size }

// AllToAllV implements Comm: send[r] goes to rank r as one message on this
// rank's stream to it, queued in order, so the exchange waits only for the
// peers' messages (one way), not for a call's round trip per peer; this
// rank's own part is copied. BenchmarkGRPCAllToAllV, 2 ranks on loopback
// (2-core machine, 2026-11-29): 184 → 48–57 µs for 64 floats, 606 → 344–403 µs
// for 16384, against one unary call per peer.
func (c *GRPCComm) AllToAllV(ctx context.Context, send [][]float32) ([][]float32, error) {
	if len(send) != c.size {
		return nil, fmt.Errorf("transport: AllToAllV: %d send slices for %d ranks", len(send), c.size)
	}
	if err := c.aborted(); err != nil {
		return nil, err
	}
	c.seq++
	seq := c.seq
	recv := make([][]float32, c.size)
	recv[c.rank] = append([]float32(nil), send[c.rank]...)
	for r := range c.size {
		if r == c.rank {
			continue
		}
		select {
		case c.out[r] <- encodePut(c.rank, seq, send[r]):
		case <-ctx.Done():
			return nil, c.abort(fmt.Errorf("transport: rank %d: exchange %d sending to rank %d: %w", c.rank, seq, r, ctx.Err()))
		case <-c.done:
			return nil, c.aborted()
		}
	}
	for r := range c.size {
		if r == c.rank {
			continue
		}
		var m grpcMsg
		select {
		case m = <-c.inbox[r]:
		case <-ctx.Done():
			return nil, c.abort(fmt.Errorf("transport: rank %d: exchange %d waiting for rank %d: %w", c.rank, seq, r, ctx.Err()))
		case <-c.done:
			// A peer that sent its part and then closed (dist's stop) aborts
			// the world: its message, when here, still counts.
			select {
			case m = <-c.inbox[r]:
			default:
				return nil, c.aborted()
			}
		}
		if m.seq != seq {
			return nil, c.abort(fmt.Errorf("transport: rank %d: exchange %d got rank %d's exchange %d", c.rank, seq, r, m.seq))
		}
		recv[r] = m.data
	}
	return recv, nil
}

// Close stops this rank's server and connections; the world is aborted
// for the other ranks' next exchange with this one.
func (c *GRPCComm) Close() error {
	c.closeOnce.Do(func() {
		// Let the senders deliver what is queued (at most a second), then
		// abort the world for the peers.
		close(c.closing)
		deadline := time.After(time.Second)
		for _, f := range c.flushed {
			select {
			case <-f:
			case <-deadline:
			}
		}
		c.abort(errors.New("transport: closed"))
		c.streamStop()
		for _, p := range c.peers {
			if p != nil {
				p.Close()
			}
		}
		c.srv.Stop()
	})
	return nil
}

// abort marks the world failed (once), tells the peers, and returns the
// error wrapped in ErrAborted.
func (c *GRPCComm) abort(err error) error {
	c.once.Do(func() {
		c.err = err
		close(c.done)
		for r, p := range c.peers {
			if p == nil || r == c.rank {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			msg := []byte(fmt.Sprintf("rank %d: %v", c.rank, err))
			var ack []byte
			_ = p.Invoke(ctx, "/mkserve.transport.Rank/Abort", &msg, &ack, grpc.ForceCodec(rawCodec{}))
			cancel()
		}
	})
	return c.aborted()
}

// aborted is nil while the world is up, else the cause wrapped in ErrAborted.
func (c *GRPCComm) aborted() error {
	select {
	case <-c.done:
		return fmt.Errorf("%w: %v", ErrAborted, c.err)
	default:
		return nil
	}
}

// join registers this rank's address with the coordinator and returns
// every rank's address.
func (c *GRPCComm) join(ctx context.Context, coord, self string) ([]string, error) {
	conn, err := dial(coord)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	req := make([]byte, 8, 8+len(self))
	binary.LittleEndian.PutUint32(req, uint32(c.rank))
	binary.LittleEndian.PutUint32(req[4:], uint32(c.size))
	req = append(req, self...)
	for {
		var resp []byte
		err := conn.Invoke(ctx, "/mkserve.transport.Rank/Join", &req, &resp, grpc.ForceCodec(rawCodec{}), grpc.WaitForReady(true))
		if err == nil {
			addrs := strings.Split(string(resp), "\n")
			if len(addrs) != c.size {
				return nil, fmt.Errorf("coordinator sent %d addresses for %d ranks", len(addrs), c.size)
			}
			return addrs, nil
		}
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return nil, err
		}
		select { // the coordinator is not up yet
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// coordinator gathers the ranks' addresses on rank 0.
type coordinator struct {
	mu     sync.Mutex
	size   int
	addrs  []string
	joined int
	full   chan struct{}
}

func (c *GRPCComm) handleJoin(ctx context.Context, req []byte) ([]byte, error) {
	co := c.coord
	if co == nil {
		return nil, status.Error(codes.FailedPrecondition, "not the coordinator (rank 0)")
	}
	if len(req) < 8 {
		return nil, status.Error(codes.InvalidArgument, "short join request")
	}
	rank, size := int(binary.LittleEndian.Uint32(req)), int(binary.LittleEndian.Uint32(req[4:]))
	addr := string(req[8:])
	co.mu.Lock()
	switch {
	case size != co.size:
		co.mu.Unlock()
		return nil, status.Errorf(codes.InvalidArgument, "rank %d says the world has %d ranks, the coordinator has %d", rank, size, co.size)
	case rank < 0 || rank >= co.size:
		co.mu.Unlock()
		return nil, status.Errorf(codes.InvalidArgument, "rank %d outside [0, %d)", rank, co.size)
	case co.addrs[rank] != "":
		co.mu.Unlock()
		return nil, status.Errorf(codes.AlreadyExists, "rank %d joined twice (%s, then %s)", rank, co.addrs[rank], addr)
	}
	co.addrs[rank] = addr
	co.joined++
	if co.joined == co.size {
		close(co.full)
	}
	co.mu.Unlock()
	select {
	case <-co.full:
		return []byte(strings.Join(co.addrs, "\n")), nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// put takes one peer's message into its inbox (a status error ends the
// peer's stream).
func (c *GRPCComm) put(req []byte) error {
	src, seq, data, err := decodePut(req)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if src < 0 || src >= c.size || src == c.rank {
		return status.Errorf(codes.InvalidArgument, "message from rank %d to rank %d of %d", src, c.rank, c.size)
	}
	select {
	case c.inbox[src] <- grpcMsg{seq: seq, data: data}:
		return nil
	case <-c.done:
		return status.Error(codes.Aborted, c.aborted().Error())
	}
}

// handleStream receives one peer's puts, in order, for as long as its
// stream lasts.
func handleStream(srv any, st grpc.ServerStream) error {
	c := srv.(*GRPCComm)
	for {
		var req []byte
		if err := st.RecvMsg(&req); err != nil {
			if err == io.EOF {
				return st.SendMsg(new([]byte))
			}
			return err
		}
		if err := c.put(req); err != nil {
			return err
		}
	}
}

func (c *GRPCComm) handleAbort(_ context.Context, req []byte) ([]byte, error) {
	c.once.Do(func() {
		c.err = fmt.Errorf("aborted by %s", req)
		close(c.done)
	})
	return nil, nil
}

// encodePut is [src u32][seq u64][floats…] little-endian.
func encodePut(src int, seq uint64, data []float32) []byte {
	b := make([]byte, 12+4*len(data))
	binary.LittleEndian.PutUint32(b, uint32(src))
	binary.LittleEndian.PutUint64(b[4:], seq)
	for i, x := range data {
		binary.LittleEndian.PutUint32(b[12+4*i:], math.Float32bits(x))
	}
	return b
}

func decodePut(b []byte) (src int, seq uint64, data []float32, err error) {
	if len(b) < 12 || (len(b)-12)%4 != 0 {
		return 0, 0, nil, fmt.Errorf("put message of %d bytes", len(b))
	}
	src, seq = int(binary.LittleEndian.Uint32(b)), binary.LittleEndian.Uint64(b[4:])
	data = make([]float32, (len(b)-12)/4)
	for i := range data {
		data[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[12+4*i:]))
	}
	return src, seq, data, nil
}

func dial(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32), grpc.MaxCallSendMsgSize(math.MaxInt32)))
}

// rawCodec carries *[]byte messages as they are: the transport frames its
// own payloads, so it needs no generated protobuf code.
type rawCodec struct{}

func (rawCodec) Name() string { return "mkserve-raw" }

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("transport codec: %T is not *[]byte", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("transport codec: %T is not *[]byte", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

// rankService is the transport's gRPC service, registered by hand (the
// codec above carries raw bytes).
var rankService = grpc.ServiceDesc{
	ServiceName: "mkserve.transport.Rank",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Join", Handler: rawHandler((*GRPCComm).handleJoin)},
		{MethodName: "Abort", Handler: rawHandler((*GRPCComm).handleAbort)},
	},
	Streams: []grpc.StreamDesc{{StreamName: "Stream", Handler: handleStream, ClientStreams: true}},
}

// rawHandler adapts a bytes-in, bytes-out method to grpc's unary handler.
func rawHandler(f func(*GRPCComm, context.Context, []byte) ([]byte, error)) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		var req []byte
		if err := dec(&req); err != nil {
			return nil, err
		}
		resp, err := f(srv.(*GRPCComm), ctx, req)
		if err != nil {
			return nil, err
		}
		return &resp, nil
	}
}

// JoinLoopback joins a world of R ranks on 127.0.0.1 from this process,
// each rank's JoinGRPC on its own goroutine, exactly as R processes on one
// machine would join: for tests and tools. On an error the ranks that
// joined are closed.
func JoinLoopback(ctx context.Context, R int) ([]*GRPCComm, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("transport: loopback world: %w", err)
	}
	coord := l.Addr().String()
	l.Close()
	comms := make([]*GRPCComm, R)
	errs := make([]error, R)
	var wg sync.WaitGroup
	for r := range R {
		wg.Add(1)
		go func() {
			defer wg.Done()
			comms[r], errs[r] = JoinGRPC(ctx, GRPCConfig{Rank: r, Size: R, Coordinator: coord, JoinTimeout: 20 * time.Second})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range comms {
			if c != nil {
				c.Close()
			}
		}
		return nil, err
	}
	return comms, nil
}

// TB is the part of testing.TB that LoopbackForTest needs.
type TB interface {
	Helper()
	Fatal(args ...any)
	Cleanup(func())
}

// LoopbackForTest is JoinLoopback for a test: it fails the test on an
// error and closes the ranks when the test ends.
func LoopbackForTest(tb TB, R int) []*GRPCComm {
	tb.Helper()
	comms, err := JoinLoopback(context.Background(), R)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms
}
