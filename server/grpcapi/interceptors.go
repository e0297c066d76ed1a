package grpcapi

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// rpcBuckets span an immediate rejection to a long batch, in seconds.
var rpcBuckets = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}

// rpcMetrics count RPCs and their latency per method.
type rpcMetrics struct {
	handled *prometheus.CounterVec   // {grpc_method, grpc_code}
	latency *prometheus.HistogramVec // {grpc_method}
}

func newRPCMetrics(reg prometheus.Registerer) *rpcMetrics {
	m := &rpcMetrics{
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mkserve:grpc_server_handled_total",
			Help: "gRPC calls completed on the server, by method and status code.",
		}, []string{"grpc_method", "grpc_code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mkserve:grpc_server_handling_seconds",
			Help:    "Time from a gRPC call's start to its end on the server, by method.",
			Buckets: rpcBuckets,
		}, []string{"grpc_method"}),
	}
	m.handled = register(reg, m.handled)
	m.latency = register(reg, m.latency)
	return m
}

// register registers c on reg, or returns the equal collector already
// there (so several Servers can share a registry).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if old, ok := are.ExistingCollector.(C); ok {
				return old
			}
		}
		panic(err)
	}
	return c
}

func (m *rpcMetrics) observe(method string, code codes.Code, d time.Duration) {
	if m == nil {
		return
	}
	m.handled.WithLabelValues(method, code.String()).Inc()
	m.latency.WithLabelValues(method).Observe(d.Seconds())
}

// UnaryInterceptor records each unary call's count, latency and a log line,
// and turns a panic in the handler into codes.Internal (grpc-go does not
// recover panics: one would end the whole server).
func (s *Server) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		start := time.Now()
		defer func() {
			if p := recover(); p != nil {
				err = s.panicked(info.FullMethod, p)
			}
			s.finished(ctx, info.FullMethod, start, err)
		}()
		return handler(ctx, req)
	}
}

// StreamInterceptor records each streaming call's count, latency and a
// log line, and turns a panic in the handler into codes.Internal.
func (s *Server) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		start := time.Now()
		defer func() {
			if p := recover(); p != nil {
				err = s.panicked(info.FullMethod, p)
			}
			s.finished(ss.Context(), info.FullMethod, start, err)
		}()
		return handler(srv, ss)
	}
}

// panicked logs a handler's panic with its stack and returns the error the
// client gets.
func (s *Server) panicked(method string, p any) error {
	s.log.Error("panic in a gRPC handler", zap.String("method", method), zap.Any("panic", p), zap.Stack("stack"))
	return status.Errorf(codes.Internal, "internal error in %s", method)
}

// ServerOptions are the interceptors as options for grpc.NewServer.
func (s *Server) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(s.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(s.StreamInterceptor()),
	}
}

func (s *Server) finished(ctx context.Context, method string, start time.Time, err error) {
	d := time.Since(start)
	// The code the client gets: grpc maps a plain context error, and any
	// other plain error is Unknown.
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	code := st.Code()
	s.rpc.observe(method, code, d)
	lvl := zapcore.DebugLevel
	switch code {
	case codes.OK:
	case codes.Internal, codes.Unknown, codes.DataLoss, codes.Unimplemented:
		lvl = zapcore.ErrorLevel
	default:
		lvl = zapcore.InfoLevel
	}
	if ce := s.log.Check(lvl, "grpc call"); ce != nil {
		fields := []zap.Field{
			zap.String("method", method),
			zap.String("code", code.String()),
			zap.Duration("duration", d),
		}
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			fields = append(fields, zap.String("peer", p.Addr.String()))
		}
		if err != nil {
			fields = append(fields, zap.String("error", st.Message()))
		}
		ce.Write(fields...)
	}
}
