package grpcunary

// Tests of what a client that misbehaves (or a connection that breaks) must
// not do to the server: take Admit's places without a message, hold
// memory, wedge a drain, stop Serve.

import (
	"bytes"
	"context"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

// TestNoPlaceWithoutTheMessage: a call whose headers came but not its
// message takes no place in Admit, and its stream is reset and forgotten
// once its deadline passes or it has been idle too long, or when the
// connection closes.
func TestNoPlaceWithoutTheMessage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout string // grpc-timeout, none if empty
		close   bool
	}{
		{"deadline passes", "50m", false},
		{"deadline passed already", "0n", false},
		{"no deadline: idle", "", false},
		{"connection closes", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var admitted, done atomic.Int32
			s, addr := serveRaw(t, Options{NewConnAdmit: countingAdmit(&admitted, &done)}, &testService{},
				func(s *Server) { s.bodyIdle = 200 * time.Millisecond })
			rc := dialRaw(t, addr)
			defer rc.nc.Close()
			reset := rc.await(resetOf(1))
			var extra []hpack.HeaderField
			if tc.timeout != "" {
				extra = append(extra, hpack.HeaderField{Name: "grpc-timeout", Value: tc.timeout})
			}
			rc.headers(t, 1, "/grpc.testing.TestService/UnaryCall", false, extra...)
			// Half a message: still no place.
			if err := rc.fr.WriteData(1, false, grpcMsg(&testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte("hello")}})[:8]); err != nil {
				t.Fatal(err)
			}
			if tc.close {
				if err := rc.nc.Close(); err != nil {
					t.Fatal(err)
				}
				if !waitFor(func() bool { return len(openConns(s)) == 0 }, 15*time.Second) {
					t.Error("the connection is kept")
				}
			} else {
				select {
				case <-reset:
				case <-time.After(15 * time.Second):
					t.Fatal("the stream without its message was not reset")
				}
				if !waitFor(func() bool { return streamsOpen(s) == 0 }, 15*time.Second) {
					t.Errorf("%d streams kept after the reset", streamsOpen(s))
				}
			}
			if admitted.Load() != 0 {
				t.Errorf("a call without its message took %d places", admitted.Load())
			}
		})
	}
}

func openConns(s *Server) []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	var cs []*conn
	for c := range s.conns {
		cs = append(cs, c)
	}
	return cs
}

// streamsOpen counts the streams the server's connections hold.
func streamsOpen(s *Server) int {
	n := 0
	for _, c := range openConns(s) {
		c.smu.Lock()
		n += len(c.streams)
		c.smu.Unlock()
	}
	return n
}

// TestAdmitPlaceBackWhenHandlerReturns: a client that keeps its window shut
// does not keep the place of a call whose handler has returned.
func TestAdmitPlaceBackWhenHandlerReturns(t *testing.T) {
	var admitted, done atomic.Int32
	_, addr := serveRaw(t, Options{NewConnAdmit: countingAdmit(&admitted, &done)}, &testService{})
	rc := dialRaw(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	defer rc.nc.Close()
	reset := rc.await(resetOf(1))
	rc.headers(t, 1, "/grpc.testing.TestService/UnaryCall", false, hpack.HeaderField{Name: "grpc-timeout", Value: "100m"})
	if err := rc.fr.WriteData(1, true, grpcMsg(&testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte("hi")}})); err != nil {
		t.Fatal(err)
	}
	if !waitFor(func() bool { return done.Load() == 1 }, 10*time.Second) {
		t.Errorf("admitted %d, done %d: the handler returned, the place is kept", admitted.Load(), done.Load())
	}
	// Its deadline passes with the window still shut: the stream is reset.
	select {
	case <-reset:
	case <-time.After(15 * time.Second):
		t.Error("no RST_STREAM after the deadline passed with the window shut")
	}
}

// flood fills the server's writes to rc, which does not read them: calls
// with 16 KiB answers, each followed by PINGs (fewer than the server
// allows between requests), until the server's pending bytes are at
// their bound and it stops reading.
func flood(t *testing.T, rc *rawClient) {
	t.Helper()
	if err := rc.nc.(*net.TCPConn).SetReadBuffer(4 << 10); err != nil {
		t.Fatal(err)
	}
	call := grpcMsg(&testgrpc.SimpleRequest{ResponseSize: 16 << 10})
	var batch bytes.Buffer
	bf := http2.NewFramer(&batch, nil)
	for id := uint32(1); ; id += 2 {
		batch.Reset()
		rc.hbuf.Reset()
		for _, f := range []hpack.HeaderField{
			{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
			{Name: ":path", Value: "/grpc.testing.TestService/UnaryCall"}, {Name: ":authority", Value: "x"},
			{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
		} {
			rc.henc.WriteField(f)
		}
		// Into a bytes.Buffer: an error is a frame the framer refuses.
		if err := bf.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: rc.hbuf.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		if err := bf.WriteData(id, true, call); err != nil {
			t.Fatal(err)
		}
		for i := range 50 {
			if err := bf.WritePing(false, [8]byte{byte(i)}); err != nil {
				t.Fatal(err)
			}
		}
		if err := rc.nc.SetWriteDeadline(time.Now().Add(500 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		if _, err := rc.nc.Write(batch.Bytes()); err != nil {
			return
		}
	}
}

// TestNonReadingClientClosedAfterAgeAndGrace: a client that stops reading
// does not keep its connection past MaxConnectionAge and its grace; the
// close, which ends the blocked write early, is the age's, not a refusal
// of unread answers (whose write timeout has not passed).
func TestNonReadingClientClosedAfterAgeAndGrace(t *testing.T) {
	var refusals refusalCounts
	s, addr := serveRaw(t, Options{MaxConnectionAge: 2 * time.Second, MaxConnectionAgeGrace: 200 * time.Millisecond,
		OnRefuse: refusals.observe}, &testService{})
	rc := dialRaw(t, addr)
	defer rc.nc.Close()
	flood(t, rc)
	// Age 2 s (+10 %), 1 s to the final GOAWAY, grace and 1 s more, and a
	// second for close's own write: closed in about 5.4 s.
	open := func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.conns)
	}
	if !waitFor(func() bool { return open() == 0 }, 30*time.Second) {
		t.Errorf("the non-reading connection outlived age and grace: %d open", open())
	}
	refusals.mu.Lock()
	defer refusals.mu.Unlock()
	if n := refusals.n[RefusedUnreadAnswers]; n != 0 {
		t.Errorf("%d unread_answers refusals for a connection its age closed", n)
	}
}

// TestGracefulStopNotHeldByOneConnection: one connection whose client does
// not read does not keep GracefulStop's GOAWAY from the others.
func TestGracefulStopNotHeldByOneConnection(t *testing.T) {
	s, addr := serveRaw(t, Options{}, &testService{})
	stuck := dialRaw(t, addr)
	defer stuck.nc.Close()
	flood(t, stuck)
	const healthy = 7
	var goAways, pongs atomic.Int32
	for range healthy {
		rc := dialRaw(t, addr)
		defer rc.nc.Close()
		go func() {
			for {
				f, err := rc.fr.ReadFrame()
				if err != nil {
					return
				}
				switch f := f.(type) {
				case *http2.PingFrame:
					if f.IsAck() {
						pongs.Add(1)
					}
				case *http2.GoAwayFrame:
					goAways.Add(1)
					return
				}
			}
		}()
		if err := rc.fr.WritePing(false, [8]byte{1}); err != nil {
			t.Fatal(err)
		}
	}
	if !waitFor(func() bool { return pongs.Load() == healthy }, 10*time.Second) {
		t.Fatalf("%d of %d connections served", pongs.Load(), healthy)
	}
	stopped := make(chan struct{})
	go func() { s.GracefulStop(); close(stopped) }()
	if !waitFor(func() bool { return goAways.Load() == healthy }, 10*time.Second) {
		t.Errorf("%d of %d healthy connections got a GOAWAY", goAways.Load(), healthy)
	}
	if err := stuck.nc.Close(); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	<-stopped
}

// emfileListener fails its first Accept as a process out of descriptors
// does, then accepts.
type emfileListener struct {
	net.Listener
	calls atomic.Int32
}

func (l *emfileListener) Accept() (net.Conn, error) {
	if l.calls.Add(1) == 1 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// TestServeWaitsOutEMFILE: running out of descriptors for a moment does not
// stop Serve (the service would exit).
func TestServeWaitsOutEMFILE(t *testing.T) {
	s := NewServer(Options{})
	defer s.Stop()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(&emfileListener{Listener: inner}) }()
	select {
	case err := <-served:
		t.Errorf("Serve returned on EMFILE: %v", err)
	case <-time.After(time.Second):
	}
}

// TestAnnouncedSizeNotAllocatedUnadmitted: a call gets a buffer for the
// bytes that came, not for the message size it announces: a thousand
// streams each announcing 256 KiB in 5 bytes took 258 MiB before.
func TestAnnouncedSizeNotAllocatedUnadmitted(t *testing.T) {
	s := NewServer(Options{MaxRecvMsgSize: 256 << 10})
	healthpb.RegisterHealthServer(s, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveTillCleanup(t, s, ln)
	defer s.Stop()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	rc := dialRaw(t, ln.Addr().String())
	defer rc.nc.Close()
	pong := rc.await(func(f http2.Frame) bool {
		p, ok := f.(*http2.PingFrame)
		return ok && p.IsAck()
	})
	const streams = 1000
	n := 256 << 10
	prefix := []byte{0, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
	for i := range streams {
		id := uint32(2*i + 1)
		rc.headers(t, id, "/grpc.health.v1.Health/Check", false)
		if err := rc.fr.WriteData(id, false, prefix); err != nil {
			t.Fatal(err)
		}
	}
	// Answered once everything before it was read.
	if err := rc.fr.WritePing(false, [8]byte{9}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-pong:
	case <-time.After(30 * time.Second):
		t.Fatal("no PING answer")
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 64<<20 {
		t.Errorf("%d streams of 5 bytes each: the heap grew by %d MiB", streams, grew>>20)
	}
}

// TestSlowMessageKeepsComing: a message whose DATA keeps coming, slower
// than the idle bound in all but well within it between frames, is served.
func TestSlowMessageKeepsComing(t *testing.T) {
	_, addr := serveRaw(t, Options{}, &testService{}, func(s *Server) { s.bodyIdle = 2 * time.Second })
	rc := dialRaw(t, addr)
	defer rc.nc.Close()
	answered := make(chan bool, 1)
	go func() {
		for {
			f, err := rc.fr.ReadFrame()
			if err != nil {
				answered <- false
				return
			}
			switch f := f.(type) {
			case *http2.RSTStreamFrame:
				answered <- false
				return
			case *http2.DataFrame:
				if f.StreamID == 1 {
					answered <- true
					return
				}
			}
		}
	}()
	rc.headers(t, 1, "/grpc.testing.TestService/UnaryCall", false)
	msg := grpcMsg(&testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: bytes.Repeat([]byte("x"), 64)}})
	// Eight pieces 300 ms apart: 2.1 s from the first to the last, past the
	// idle bound, with 1.7 s to spare between two pieces for a busy machine.
	pace := time.NewTicker(300 * time.Millisecond)
	defer pace.Stop()
	for i := range 8 {
		if i > 0 {
			<-pace.C
		}
		piece := msg[i*len(msg)/8 : (i+1)*len(msg)/8]
		if err := rc.fr.WriteData(1, i == 7, piece); err != nil {
			t.Fatal(err)
		}
	}
	if !<-answered {
		t.Error("the call was reset, not answered")
	}
}

// TestTrickleResetWithinTheServersBound: a message that keeps coming, a few
// bytes at a time, is reset once the server's bound passes, whatever
// deadline the call's grpc-timeout gives.
func TestTrickleResetWithinTheServersBound(t *testing.T) {
	var refusals refusalCounts
	_, addr := serveRaw(t, Options{OnRefuse: refusals.observe}, &testService{}, func(s *Server) { s.bodyTotal = 500 * time.Millisecond })
	defer refusals.want(t, RefusedSlowMessage)
	rc := dialRaw(t, addr)
	defer rc.nc.Close()
	reset := rc.await(resetOf(1))
	rc.headers(t, 1, "/grpc.testing.TestService/UnaryCall", false, hpack.HeaderField{Name: "grpc-timeout", Value: "99999999H"})
	msg := grpcMsg(&testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: bytes.Repeat([]byte("x"), 1000)}})
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-reset:
			return
		case <-tick.C:
		}
		if i >= len(msg)-1 {
			t.Fatal("the trickled message was never reset")
		}
		if err := rc.fr.WriteData(1, false, msg[i:i+1]); err != nil {
			t.Fatal(err)
		}
	}
}

// TestIncompleteMessagesHeldWithinTheBound: streams whose messages never
// finish cannot make one connection hold more than its bound: the stream
// that would pass it is answered RESOURCE_EXHAUSTED; the bytes are given
// back once the streams are reset.
func TestIncompleteMessagesHeldWithinTheBound(t *testing.T) {
	var refusals refusalCounts
	s, addr := serveRaw(t, Options{MaxRecvMsgSize: 256 << 10, OnRefuse: refusals.observe}, &testService{},
		func(s *Server) { s.bodyIdle = 2 * time.Second })
	defer refusals.want(t, RefusedStreamBytes, RefusedSlowMessage)
	rc := dialRaw(t, addr)
	defer rc.nc.Close()
	refused := rc.await(refusal)
	// Each stream announces 200,000 bytes and sends 16 KiB, until one is
	// refused; twice the bound sent, the refusal must have come.
	n := 200_000
	piece := append([]byte{0, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, make([]byte, 16<<10-5)...)
	enough := 2 * s.connHold / int64(len(piece))
send:
	for id := uint32(1); ; id += 2 {
		select {
		case <-refused:
			break send
		default:
		}
		if int64(id/2) > enough {
			select {
			case <-refused:
				break send
			case <-time.After(10 * time.Second):
				t.Fatalf("%d bytes held on one connection, none refused", s.totals.bytes.Load())
			}
		}
		rc.headers(t, id, "/grpc.testing.TestService/UnaryCall", false)
		if err := rc.fr.WriteData(id, false, piece); err != nil {
			t.Fatal(err)
		}
	}
	if held := s.totals.bytes.Load(); held > s.connHold {
		t.Errorf("held %d bytes, past the connection's bound %d", held, s.connHold)
	}
	// The streams go idle and are reset: their bytes are given back.
	if !waitFor(func() bool { return s.totals.bytes.Load() == 0 }, 15*time.Second) {
		t.Errorf("%d bytes still held", s.totals.bytes.Load())
	}
}

// TestInterleavedLargeMessagesServed: many large messages at once on one
// connection, which grpc-go's client sends 16 KiB of each in turn, are all
// served: none waits for another to finish first.
func TestInterleavedLargeMessagesServed(t *testing.T) {
	_, cc := start(t, Options{MaxRecvMsgSize: 256 << 10}, &testService{})
	client := testgrpc.NewTestServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := make(chan error, 24)
	for range 24 {
		go func() {
			_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: make([]byte, 250<<10)}})
			errs <- err
		}()
	}
	for range 24 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestHeldStreamsLeaveRoomForOthers: connections that open streams and
// never finish them, holding large headers or parts of large messages, are
// refused past their bounds (a new stream REFUSED_STREAM, a message
// RESOURCE_EXHAUSTED) and hold no more than the server's bound in all; a
// call on another connection is served.
func TestHeldStreamsLeaveRoomForOthers(t *testing.T) {
	const bound = 1 << 20
	big := strings.Repeat("v", 4<<10)
	n := 200_000
	piece := append([]byte{0, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, make([]byte, 8<<10)...)
	for _, tc := range []struct {
		name string
		open func(rc *rawClient, id uint32)
	}{
		{"headers", func(rc *rawClient, id uint32) {
			// Never indexed: each stream's value is a string of its own.
			rc.headers(t, id, "/grpc.testing.TestService/UnaryCall", false, hpack.HeaderField{Name: "x-big", Value: big, Sensitive: true})
		}},
		{"messages", func(rc *rawClient, id uint32) {
			rc.headers(t, id, "/grpc.testing.TestService/UnaryCall", false)
			if err := rc.fr.WriteData(id, false, piece); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, addr := serveRaw(t, Options{MaxStreamBytes: bound, MaxRecvMsgSize: 256 << 10}, &testService{})
			var hostile []*rawClient
			for range 4 {
				rc := dialRaw(t, addr)
				defer rc.nc.Close()
				hostile = append(hostile, rc)
				refused := rc.await(refusal)
				for id := uint32(1); ; id += 2 {
					if id > 4000 {
						t.Fatal("2000 streams held on one connection, none refused")
					}
					tc.open(rc, id)
					select {
					case <-refused:
					case <-time.After(time.Millisecond):
						continue
					}
					break
				}
			}
			if held := s.totals.bytes.Load(); held > bound {
				t.Errorf("held streams hold %d bytes, past the bound %d", held, bound)
			}
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := testgrpc.NewTestServiceClient(cc).UnaryCall(ctx, &testgrpc.SimpleRequest{}); err != nil {
				t.Errorf("a call on another connection: %v", err)
			}
			// Their connections dropped, what they held is given back.
			for _, rc := range hostile {
				if err := rc.nc.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if !waitFor(func() bool { return s.totals.bytes.Load() == 0 }, 10*time.Second) {
				t.Errorf("after the connections closed: %d bytes held", s.totals.bytes.Load())
			}
		})
	}
}

// TestPingFloodThrottled: a client that sends PINGs (or SETTINGS) and
// nothing else gets no more than maxControlFrames answered a second, and
// is not closed; one whose PINGs come between requests is not slowed.
func TestPingFloodThrottled(t *testing.T) {
	const sent = 3 * maxControlFrames
	for _, tc := range []struct {
		name      string
		withCalls bool
		settings  bool
	}{
		{"pings alone", false, false},
		{"settings alone", false, true},
		{"pings between calls", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var refusals refusalCounts
			_, addr := serveRaw(t, Options{OnRefuse: refusals.observe}, &testService{})
			if !tc.withCalls {
				defer refusals.want(t, RefusedControlFlood)
			}
			// Timed from before the dial: the server's first second starts
			// at the SETTINGS frame dialRaw sends.
			began := time.Now()
			rc := dialRaw(t, addr)
			defer rc.nc.Close()
			answered := make(chan time.Duration, 1)
			go func() {
				acks := 0
				for {
					f, err := rc.fr.ReadFrame()
					if err != nil {
						return
					}
					switch f := f.(type) {
					case *http2.GoAwayFrame:
						t.Errorf("closed: GOAWAY %v", f.ErrCode)
						return
					case *http2.PingFrame:
						acks++
					case *http2.SettingsFrame:
						if f.IsAck() {
							acks++
						}
					}
					if acks == sent+1 { // and the client preface's SETTINGS
						answered <- time.Since(began)
						return
					}
				}
			}()
			id := uint32(1)
			for i := range sent {
				if tc.withCalls && i%(maxControlFrames/2) == 0 {
					rc.headers(t, id, "/grpc.testing.TestService/UnaryCall", false)
					if err := rc.fr.WriteData(id, true, grpcMsg(&testgrpc.SimpleRequest{})); err != nil {
						t.Fatal(err)
					}
					id += 2
				}
				var err error
				if tc.settings {
					err = rc.fr.WriteSettings()
				} else {
					err = rc.fr.WritePing(false, [8]byte{byte(i)})
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			select {
			case took := <-answered:
				// Throttled: the third hundred waits for the third second.
				if !tc.withCalls && took < 2*time.Second-100*time.Millisecond {
					t.Errorf("%d answered in %v: not throttled", sent, took)
				}
			case <-time.After(20 * time.Second):
				t.Errorf("not all %d answered", sent)
			}
		})
	}
}

// refusalCounts collects what Options.OnRefuse reports.
type refusalCounts struct {
	mu sync.Mutex
	n  map[Refusal]int
}

func (r *refusalCounts) observe(why Refusal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[Refusal]int{}
	}
	r.n[why]++
}

// want fails t unless each of whys was reported, and nothing else.
func (r *refusalCounts) want(t *testing.T, whys ...Refusal) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, why := range whys {
		if r.n[why] == 0 {
			t.Errorf("no %s refusal reported; got %v", why, r.n)
		}
	}
	for why := range r.n {
		if !slices.Contains(whys, why) {
			t.Errorf("%s refusal reported (%d), want only %v", why, r.n[why], whys)
		}
	}
}
