// Package grpcunary serves the unary methods of gRPC services over HTTP/2,
// with less CPU per call than grpc-go's server.
//
// A rate limit decision is one small unary call, and grpc-go's server
// transport is built for any call: a goroutine per connection reading
// frames, per-stream buffers and flow control goroutines, a writer goroutine
// fed through a control queue. For calls this small that machinery costs
// more than the decision itself; this server does only what a small unary
// call needs (the figures, against grpc-go's server: docs/bench.md, "The
// gRPC transport"). The design, file by file:
//
//   - Read loop (reader.go): each connection has one reader goroutine that
//     reads frames and acts on each (headers, DATA, SETTINGS, PING,
//     WINDOW_UPDATE, RST_STREAM). It never runs a handler. conn.go sets a
//     connection up (preface, SETTINGS), drains it (two-step GOAWAY) and
//     closes it.
//   - Stream lifecycle (stream.go): a stream opens with its headers; the
//     reader gathers its message; once the message is whole the call is
//     admitted and dispatched to a worker (server.go), whose handler
//     answers (call.go); finish forgets the stream. A stream can end
//     early: reset by either side, its message too late, or refused.
//   - Flow control (flow.go): the receive windows are given back as the
//     reader takes the bytes, and what open streams hold (headers, state,
//     message bytes not yet decoded) is counted per connection and for the
//     server; a stream past either bound is refused, the last quarter of
//     the server's kept for connections holding little (conn.canHold).
//   - Writer (writer.go): handlers, the reader and timers append frames
//     to the connection's pending bytes under one lock, and one flusher
//     goroutine writes them, so that answers finishing together share one
//     system call; DATA waits for the client's send windows there.
//   - Limits (limits.go): every bound in one place: message size,
//     concurrent streams, bytes held, header blocks, PING and SETTINGS
//     floods, unread answers, the time a message may take to come. Each
//     refusal is reported, by name, to Options.OnRefuse.
//   - Admission: a call competes for a place (Options.NewConnAdmit) only
//     once its message is whole, so a client that sends slowly or not at
//     all holds no place.
//
// What it serves: the methods of services registered with RegisterService
// (generated RegisterXxxServer functions take a Server), over cleartext
// HTTP/2 with prior knowledge (as grpc-go's plaintext) or TLS with ALPN h2;
// request metadata, grpc-timeout deadlines, RST_STREAM cancellation, flow
// control both ways, a bound on message size and on concurrent streams,
// graceful stop and a maximum connection age (two-step GOAWAY, as
// grpc-go). Streaming methods (server reflection, health's Watch, the
// Rate Limit Quota Service's streams) are served simply (streaming.go). Not served: compressed messages
// (UNIMPLEMENTED, as grpc-go without the compressor), stream interceptors,
// stats handlers. It passes h2spec's HTTP/2 conformance suite, which make
// test runs.
package grpcunary

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
)

// Options configure a Server. The zero value serves cleartext HTTP/2 with
// grpc-go's proto codec and the defaults of limits.go.
type Options struct {
	// TLS, when set, makes the server serve TLS only; "h2" is offered by
	// ALPN whatever NextProtos hold, also on configs GetConfigForClient
	// returns.
	TLS *tls.Config
	// Codec decodes requests and encodes answers (default: proto).
	Codec encoding.CodecV2
	// Interceptors run around every handler, the first outermost.
	Interceptors []grpc.UnaryServerInterceptor
	// NewConnAdmit, when set, is called once per connection; the AdmitFunc
	// it returns is called for each of that connection's unary calls once
	// its message has come whole, before its handler runs (see AdmitFunc).
	NewConnAdmit func() AdmitFunc
	// MaxRecvMsgSize bounds a request message; a larger one is answered
	// RESOURCE_EXHAUSTED without being read whole.
	MaxRecvMsgSize int
	// MaxConcurrentStreams is advertised to clients and enforced.
	MaxConcurrentStreams uint32
	// MaxStreamBytes bounds what the streams not yet over hold, headers,
	// state and message bytes, over all connections (default
	// DefaultMaxStreamBytes).
	MaxStreamBytes int64
	// MaxConnectionAge, when positive, asks a client to move to a new
	// connection after about that long (±10 %, so that a fleet's
	// connections do not all move at once); MaxConnectionAgeGrace, when
	// positive, then bounds how long its calls in flight may take.
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
	// Workers are goroutines kept to run handlers (default: 8 per core);
	// a call arriving when all are busy runs on a new goroutine.
	Workers int
	// OnRefuse, when set, is called each time one of the server's bounds
	// (limits.go) refuses a client something; it must not block.
	OnRefuse func(Refusal)
}

// AdmitFunc decides whether a call whose message has come whole may run:
// an error answers the call with that error's status; done, when not nil,
// is called once the call's handler has returned, however the call ends
// (a call admitted always gets its handler). A call still arriving holds
// nothing, so a client that sends slowly or not at all cannot take
// another's place.
type AdmitFunc func(fullMethod string) (done func(), err error)

// Server serves unary gRPC methods. Register services, then Serve; stop
// with GracefulStop or Stop.
type Server struct {
	opts        Options
	codec       encoding.CodecV2
	interceptor grpc.UnaryServerInterceptor
	methods     map[string]*method
	services    map[string]grpc.ServiceInfo
	work        chan *stream
	quit        chan struct{} // closed by the first GracefulStop or Stop

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	stopping  bool
	connsDone sync.WaitGroup // serveConn calls
	handlers  sync.WaitGroup // calls dispatched to a handler
	workers   sync.WaitGroup
	stopOnce  sync.Once

	connHold int64 // connHoldFor(MaxRecvMsgSize)
	// What the connections' streams hold (conn.canHold), apart from the
	// fields every call reads: calls on all connections write it.
	totals *streamTotals
	// bodyTimeout and bodyIdleTimeout, shorter in tests.
	bodyTotal, bodyIdle time.Duration
}

// streamTotals is what the streams of all connections hold.
type streamTotals struct {
	bytes atomic.Int64
}

// method is a registered method: unary (handler) or streaming (stream).
type method struct {
	impl    any
	handler grpc.MethodHandler
	stream  grpc.StreamHandler
}

// NewServer returns a Server with opts, its zero fields at the defaults.
func NewServer(opts Options) *Server {
	if opts.Codec == nil {
		opts.Codec = encoding.GetCodecV2(grpcproto.Name)
	}
	if opts.MaxRecvMsgSize <= 0 {
		opts.MaxRecvMsgSize = DefaultMaxRecvMsgSize
	}
	if opts.MaxConcurrentStreams == 0 {
		opts.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if opts.MaxStreamBytes <= 0 {
		opts.MaxStreamBytes = DefaultMaxStreamBytes
	}
	if opts.Workers <= 0 {
		opts.Workers = 8 * runtime.GOMAXPROCS(0)
	}
	if opts.TLS != nil {
		opts.TLS = withH2(opts.TLS)
	}
	s := &Server{
		connHold:    connHoldFor(opts.MaxRecvMsgSize),
		totals:      new(streamTotals),
		bodyTotal:   bodyTimeout,
		bodyIdle:    bodyIdleTimeout,
		opts:        opts,
		codec:       opts.Codec,
		interceptor: chain(opts.Interceptors),
		methods:     map[string]*method{},
		services:    map[string]grpc.ServiceInfo{},
		work:        make(chan *stream),
		quit:        make(chan struct{}),
		listeners:   map[net.Listener]struct{}{},
		conns:       map[*conn]struct{}{},
	}
	for range opts.Workers {
		s.workers.Go(func() {
			for {
				select {
				case st := <-s.work:
					st.c.handle(st)
				case <-s.quit:
					return
				}
			}
		})
	}
	return s
}

// RegisterService registers the methods of a service (grpc.ServiceRegistrar)
// before Serve.
func (s *Server) RegisterService(desc *grpc.ServiceDesc, impl any) {
	info := grpc.ServiceInfo{Metadata: desc.Metadata}
	for _, m := range desc.Methods {
		s.methods["/"+desc.ServiceName+"/"+m.MethodName] = &method{impl: impl, handler: m.Handler}
		info.Methods = append(info.Methods, grpc.MethodInfo{Name: m.MethodName})
	}
	for _, st := range desc.Streams {
		s.methods["/"+desc.ServiceName+"/"+st.StreamName] = &method{impl: impl, stream: st.Handler}
		info.Methods = append(info.Methods, grpc.MethodInfo{Name: st.StreamName, IsClientStream: st.ClientStreams, IsServerStream: st.ServerStreams})
	}
	s.services[desc.ServiceName] = info
}

// GetServiceInfo returns the registered services, for server reflection
// (reflection.Register takes a Server).
func (s *Server) GetServiceInfo() map[string]grpc.ServiceInfo {
	return s.services
}

// ErrServerStopped is returned by Serve after GracefulStop or Stop.
var ErrServerStopped = errors.New("grpcunary: the server was stopped")

// Serve accepts connections on ln and serves them until ln fails or the
// server stops; it closes ln. After a stop it returns ErrServerStopped.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		_ = ln.Close() // not served: the stop is what Serve reports
		return ErrServerStopped
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		_ = ln.Close() // stop may have closed it already; Serve reports why it ended
	}()

	var pause time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			select {
			case <-s.quit:
				return ErrServerStopped
			default:
			}
			if temporary(err) {
				// Out of file descriptors and the like: wait, as net/http
				// and grpc-go do, rather than stop serving.
				pause = min(max(2*pause, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(pause):
					continue
				case <-s.quit:
					return ErrServerStopped
				}
			}
			return err
		}
		pause = 0
		if !s.track(nil) {
			_ = nc.Close() // refused, never served: nothing to report
			return ErrServerStopped
		}
		go s.serveConn(nc)
	}
}

// refuse reports r to Options.OnRefuse.
func (s *Server) refuse(r Refusal) {
	if s.opts.OnRefuse != nil {
		s.opts.OnRefuse(r)
	}
}

// refuse reports r to the server's Options.OnRefuse.
func (c *conn) refuse(r Refusal) { c.srv.refuse(r) }

// track counts a serveConn about to start (c nil) or registers c; it
// reports false once the server stops.
func (s *Server) track(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return false
	}
	if c == nil {
		s.connsDone.Add(1)
		return true
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) serveConn(nc net.Conn) {
	defer s.connsDone.Done()
	if s.opts.TLS != nil {
		tc := tls.Server(nc, s.opts.TLS)
		ctx, cancel := context.WithTimeout(context.Background(), DefaultHandshakeTimeout)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				s.refuse(RefusedHandshake)
			}
			_ = nc.Close() // the handshake failed already: nothing more to report
			return
		}
		nc = tc
	}
	c := newConn(s, nc)
	if !s.track(c) {
		_ = nc.Close() // refused, never served: nothing to report
		return
	}
	c.serve()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// GracefulStop stops accepting connections, asks every client to leave its
// connection (GOAWAY), and returns once the calls in flight have been
// answered and the connections closed.
func (s *Server) GracefulStop() {
	s.stop(false)
}

// Stop closes every listener and connection at once; calls in flight see
// their contexts canceled, and Stop returns when their handlers have.
func (s *Server) Stop() {
	s.stop(true)
}

func (s *Server) stop(now bool) {
	s.mu.Lock()
	s.stopping = true
	s.stopOnce.Do(func() { close(s.quit) })
	for ln := range s.listeners {
		_ = ln.Close() // its Serve returns ErrServerStopped whatever the close did
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		if now {
			c.close()
		} else {
			c.drain()
		}
	}
	s.connsDone.Wait()
	s.handlers.Wait()
	s.workers.Wait()
}

// dispatch runs st's handler on a free worker, or on a new goroutine.
func (s *Server) dispatch(st *stream) {
	s.handlers.Add(1)
	select {
	case s.work <- st:
	default:
		go st.c.handle(st)
	}
}

// chain makes one interceptor of several, the first outermost.
func chain(ics []grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	switch len(ics) {
	case 0:
		return nil
	case 1:
		return ics[0]
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return ics[0](ctx, req, info, chained(ics[1:], info, handler))
	}
}

func chained(ics []grpc.UnaryServerInterceptor, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) grpc.UnaryHandler {
	if len(ics) == 0 {
		return handler
	}
	return func(ctx context.Context, req any) (any, error) {
		return ics[0](ctx, req, info, chained(ics[1:], info, handler))
	}
}

// withH2 returns a copy of cfg that offers h2 by ALPN, on the configs its
// GetConfigForClient returns too.
func withH2(cfg *tls.Config) *tls.Config {
	cfg = cfg.Clone()
	cfg.NextProtos = []string{"h2"}
	if get := cfg.GetConfigForClient; get != nil {
		cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			c, err := get(hello)
			if err != nil || c == nil {
				return c, err
			}
			c = c.Clone()
			c.NextProtos = []string{"h2"}
			return c, nil
		}
	}
	return cfg
}

// temporary reports an accept error worth waiting out: a timeout, or what
// net.Error's deprecated Temporary still says of EMFILE, ENFILE and the
// like (grpc-go and net/http wait on it too).
func temporary(err error) bool {
	var ne interface{ Temporary() bool }
	if errors.As(err, &ne) && ne.Temporary() {
		return true
	}
	var te net.Error
	return errors.As(err, &te) && te.Timeout()
}
