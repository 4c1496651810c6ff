package grpcunary

// FuzzConn feeds a Server's connection arbitrary bytes after the client
// preface. `make fuzz` runs it; the inputs under testdata/fuzz/FuzzConn
// (kept from fuzzing runs) and the seeds below are replayed by go test.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
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

const (
	// fuzzPingWait bounds the wait for the answer to the PING that follows
	// an input of whole frames (all of them read by then), before the
	// client half-closes. Not an assertion: a late answer only ends the
	// input sooner.
	fuzzPingWait = time.Second
	// fuzzCloseBound bounds how long the server takes to close the
	// connection once the client has half-closed it: past it, the server
	// hangs on the input.
	fuzzCloseBound = 10 * time.Second
	// fuzzGoroutineSlack is how many goroutines above those the fuzz
	// function started with may still run once an input is over (timers
	// firing, a handler returning), waited for up to fuzzCloseBound.
	fuzzGoroutineSlack = 8
)

var fuzzPingData = [8]byte{'f', 'u', 'z', 'z', 'p', 'i', 'n', 'g'}

// FuzzConn: whatever a client sends after the preface, the server does not
// crash, writes only frames that parse, closes the connection once the
// client has half-closed it, leaves no goroutine behind, and still answers
// a grpc-go client's call.
func FuzzConn(f *testing.F) {
	seeds, err := fuzzSeeds()
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range seeds {
		f.Add(seed)
	}

	// One server per fuzzing process, and a grpc-go client to check that it
	// still serves.
	s := NewServer(Options{})
	testgrpc.RegisterTestServiceServer(s, &testService{})
	healthpb.RegisterHealthServer(s, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	addr := ln.Addr().String()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		if err := cc.Close(); err != nil {
			f.Errorf("closing the grpc-go client: %v", err)
		}
		s.Stop()
		if err := <-served; !errors.Is(err, ErrServerStopped) {
			f.Errorf("Serve: %v, want ErrServerStopped", err)
		}
	})
	client := testgrpc.NewTestServiceClient(cc)
	call := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), fuzzCloseBound)
		defer cancel()
		resp, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte("still there?")}})
		if err == nil && string(resp.GetPayload().GetBody()) != "still there?" {
			err = errors.New("wrong answer: " + resp.String())
		}
		return err
	}
	if err := call(); err != nil {
		f.Fatalf("a call before any input: %v", err)
	}
	var (
		baseOnce sync.Once
		base     int
	)

	f.Fuzz(func(t *testing.T, input []byte) {
		baseOnce.Do(func() { base = runtime.NumGoroutine() })
		fuzzOneConn(t, addr, input)

		// The connection is gone from the server, and so are its
		// goroutines (the grpc-go client's stays).
		settled := waitFor(func() bool {
			s.mu.Lock()
			n := len(s.conns)
			s.mu.Unlock()
			return n <= 1 && runtime.NumGoroutine() <= base+fuzzGoroutineSlack
		}, fuzzCloseBound)
		if !settled {
			s.mu.Lock()
			n := len(s.conns)
			s.mu.Unlock()
			var stacks strings.Builder
			_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1) // a strings.Builder does not fail
			t.Fatalf("%s after the input: %d connections open (want the grpc-go client's alone), %d goroutines (at most %d+%d)\n%s",
				fuzzCloseBound, n, runtime.NumGoroutine(), base, fuzzGoroutineSlack, stacks.String())
		}
		if err := call(); err != nil {
			t.Fatalf("a call after the input: %v", err)
		}
	})
}

// fuzzOneConn writes the preface, input and a PING on a new connection,
// reads what the server answers until the PING's answer (when the input is
// whole frames; at most fuzzPingWait), half-closes, and reads until the
// server closes. A last frame cut short by the server's close is let be
// (io.ErrUnexpectedEOF), as a reset is.
func fuzzOneConn(t *testing.T, addr string, input []byte) {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	pong := make(chan struct{}, 1)
	readDone := make(chan struct{})
	var readErr error
	go func() {
		defer close(readDone)
		fr := http2.NewFramer(nil, nc)
		// The input may raise the largest frame the client takes.
		fr.SetMaxReadFrameSize(1<<24 - 1)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				readErr = err
				return
			}
			if p, ok := f.(*http2.PingFrame); ok && p.IsAck() && p.Data == fuzzPingData {
				select {
				case pong <- struct{}{}:
				default: // the input's own PING with the same data
				}
			}
		}
	}()

	var out bytes.Buffer
	out.WriteString(http2.ClientPreface)
	out.Write(input)
	if err := http2.NewFramer(&out, nil).WritePing(false, fuzzPingData); err != nil {
		t.Fatal(err)
	}
	if err := nc.SetWriteDeadline(time.Now().Add(fuzzCloseBound)); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Write(out.Bytes()); err != nil && !closedByPeer(err) {
		t.Fatalf("writing the input: %v (the server stopped reading, and did not close)", err)
	}
	if wholeFrames(input) {
		// The server answers the PING, or closes the connection.
		select {
		case <-pong:
		case <-readDone:
		case <-time.After(fuzzPingWait):
		}
	} // else the input's last frame swallows the PING
	// The server may have closed the connection already, and then the
	// half-close fails; the read below sees the server's close either way.
	_ = nc.(*net.TCPConn).CloseWrite()

	select {
	case <-readDone:
	case <-time.After(fuzzCloseBound):
		t.Fatalf("the server did not close the connection %s after the client half-closed it", fuzzCloseBound)
	}
	var se http2.StreamError
	var ce http2.ConnectionError
	switch {
	case errors.As(readErr, &se), errors.As(readErr, &ce):
		t.Fatalf("the server wrote a frame that does not parse: %v", readErr)
	case !errors.Is(readErr, io.EOF) && !errors.Is(readErr, io.ErrUnexpectedEOF) && !closedByPeer(readErr):
		t.Fatalf("reading the server's frames: %v", readErr)
	}
}

// wholeFrames reports whether b is whole frames, by their lengths.
func wholeFrames(b []byte) bool {
	for len(b) >= 9 {
		n := int(b[0])<<16 | int(b[1])<<8 | int(b[2])
		if len(b) < 9+n {
			return false
		}
		b = b[9+n:]
	}
	return len(b) == 0
}

// closedByPeer reports an error of a connection the server closed (a
// reset when it closed with bytes of the client unread).
func closedByPeer(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// fuzzSeeds are inputs that reach the frame handlers: calls as a client
// makes them, and the misuses h2spec checks.
func fuzzSeeds() ([][]byte, error) {
	const unary = "/grpc.testing.TestService/UnaryCall"
	msg := grpcMsg(&testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte("hello")}})
	var seeds [][]byte
	// w keeps the first error of the seeds' frame writes. They write into a
	// bytes.Buffer, so one fails only when the framer refuses a frame: a
	// mistake in a seed.
	var writeErr error
	w := func(err error) {
		if writeErr == nil && err != nil {
			writeErr = err
		}
	}
	add := func(build func(fr *http2.Framer, hdrs func(path string, extra ...string) []byte)) {
		var buf bytes.Buffer
		fr := http2.NewFramer(&buf, nil)
		var hbuf bytes.Buffer
		enc := hpack.NewEncoder(&hbuf)
		// hdrs encodes a gRPC request's headers for path, and extra
		// (names and values).
		hdrs := func(path string, extra ...string) []byte {
			hbuf.Reset()
			fields := append([]string{":method", "POST", ":scheme", "http", ":path", path, ":authority", "x",
				"content-type", "application/grpc", "te", "trailers"}, extra...)
			for i := 0; i+1 < len(fields); i += 2 {
				enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
			}
			return bytes.Clone(hbuf.Bytes())
		}
		build(fr, hdrs)
		seeds = append(seeds, buf.Bytes())
	}
	// headers writes a header block, in CONTINUATIONs past 16 KiB.
	headers := func(fr *http2.Framer, id uint32, block []byte, endStream bool) {
		const max = 16 << 10
		first := block[:min(len(block), max)]
		block = block[len(first):]
		w(fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(block) == 0, EndStream: endStream}))
		for len(block) > 0 {
			piece := block[:min(len(block), max)]
			block = block[len(piece):]
			w(fr.WriteContinuation(id, len(block) == 0, piece))
		}
	}

	// A unary call, and two on one connection with a deadline and metadata.
	add(func(fr *http2.Framer, hdrs func(string, ...string) []byte) {
		w(fr.WriteSettings())
		headers(fr, 1, hdrs(unary), false)
		w(fr.WriteData(1, true, msg))
	})
	add(func(fr *http2.Framer, hdrs func(string, ...string) []byte) {
		w(fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20}))
		headers(fr, 1, hdrs(unary, "grpc-timeout", "1S", "x-tenant", "a", "x-id-bin", "AAE"), false)
		w(fr.WriteData(1, false, msg[:3]))
		w(fr.WriteData(1, true, msg[3:]))
		headers(fr, 3, hdrs(unary, "content-length", "12"), false)
		w(fr.WriteData(3, true, msg))
	})
	// A streaming call, a health check, a method not served, not gRPC.
	add(func(fr *http2.Framer, hdrs func(string, ...string) []byte) {
		w(fr.WriteSettings())
		headers(fr, 1, hdrs("/grpc.testing.TestService/FullDuplexCall"), false)
		w(fr.WriteData(1, false, msg))
		w(fr.WriteData(1, false, msg))
		w(fr.WriteData(1, true, nil))
		headers(fr, 3, hdrs("/grpc.health.v1.Health/Check"), false)
		w(fr.WriteData(3, true, []byte{0, 0, 0, 0, 0}))
		headers(fr, 5, hdrs("/grpc.testing.TestService/Nope"), true)
	})
	add(func(fr *http2.Framer, hdrs func(string, ...string) []byte) {
		w(fr.WriteSettings())
		var b bytes.Buffer
		enc := hpack.NewEncoder(&b)
		for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":path", "/"}, {":authority", "x"}} {
			enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		headers(fr, 1, b.Bytes(), true)
	})
	// Control frames: SETTINGS of every kind, their ACK, PING, WINDOW_UPDATE,
	// GOAWAY, and a call answered through a shut then opened window.
	add(func(fr *http2.Framer, hdrs func(string, ...string) []byte) {
		w(fr.WriteSettings(
			http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0},
			http2.Setting{ID: http2.SettingEnablePush, Val: 0},
			http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 1},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0},
			http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 20},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: 100},
		))
		w(fr.WriteSettingsAck())
		w(fr.WritePing(false, [8]byte{1}))
		w(fr.WritePing(true, [8]byte{2}))
		headers(fr, 1, hdrs(unary), false)
		w(fr.WriteData(1, true, msg))
		w(fr.WriteWindowUpdate(0, 1000))
		w(fr.WriteWindowUpdate(1, 3))
		w(fr.WriteWindowUpdate(1, 1<<16))
		w(fr.WriteGoAway(0, http2.ErrCodeNo, []byte("bye")))
	})
	// Window updates past 2^31-1, on the connection and on a stream.
	add(func(fr *http2.Framer, hdrs func(string, ...string) []byte) {
		w(fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}))
		headers(fr, 1, hdrs(unary), false)
		w(fr.WriteData(1, true, msg))
		w(fr.WriteWindowUpdate(1, 1<<31-1))
		w(fr.WriteWindowUpdate(1, 1<<31-1))
		w(fr.WriteWindowUpdate(0, 1<<31-1))
	})
	// A header block in CONTINUATIONs, and one interrupted by another frame.
	add(func(fr *http2.Framer, hdrs func(string, ...string) []byte) {
		w(fr.WriteSettings())
		block := hdrs(unary, "x-long", strings.Repeat("v", 100))
		w(fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:10]}))
		w(fr.WriteContinuation(1, false, block[10:40]))
		w(fr.WriteContinuation(1, true, block[40:]))
		w(fr.WriteData(1, true, msg))
	})
	add(func(fr *http2.Framer, hdrs func(string, ...string) []byte) {
		w(fr.WriteSettings())
		block := hdrs(unary)
		w(fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:5]}))
		w(fr.WriteData(1, true, msg))
		w(fr.WriteContinuation(1, true, block[5:]))
	})
	// RST_STREAM: on a call whose message is coming, on an idle stream.
	add(func(fr *http2.Framer, hdrs func(string, ...string) []byte) {
		w(fr.WriteSettings())
		headers(fr, 1, hdrs(unary), false)
		w(fr.WriteData(1, false, msg[:2]))
		w(fr.WriteRSTStream(1, http2.ErrCodeCancel))
		w(fr.WriteData(1, true, msg[2:]))
		w(fr.WriteRSTStream(7, http2.ErrCodeCancel))
	})
	// PRIORITY: a stream depending on itself, by PRIORITY and by HEADERS.
	add(func(fr *http2.Framer, hdrs func(string, ...string) []byte) {
		w(fr.WriteSettings())
		w(fr.WritePriority(3, http2.PriorityParam{StreamDep: 3, Weight: 7}))
		w(fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hdrs(unary), EndHeaders: true,
			Priority: http2.PriorityParam{StreamDep: 1, Exclusive: true, Weight: 255}}))
		w(fr.WriteData(1, true, msg))
	})
	// DATA on a stream that ended, on stream 0, on an even stream; HEADERS
	// with a lower id than the last.
	add(func(fr *http2.Framer, hdrs func(string, ...string) []byte) {
		w(fr.WriteSettings())
		headers(fr, 3, hdrs(unary), false)
		w(fr.WriteData(3, true, msg))
		w(fr.WriteData(3, true, msg))
		headers(fr, 1, hdrs(unary), true)
		w(fr.WriteRawFrame(http2.FrameData, 0, 0, []byte("x")))
		w(fr.WriteRawFrame(http2.FrameData, 0, 2, []byte("x")))
	})
	// Frames of the wrong length: PING of 7 bytes, SETTINGS of 5,
	// WINDOW_UPDATE of 3, RST_STREAM of 5; one past the largest frame; a
	// frame of unknown type; PUSH_PROMISE.
	for _, raw := range []struct {
		t       http2.FrameType
		flags   http2.Flags
		id      uint32
		payload []byte
	}{
		{http2.FramePing, 0, 0, make([]byte, 7)},
		{http2.FrameSettings, 0, 0, make([]byte, 5)},
		{http2.FrameWindowUpdate, 0, 0, make([]byte, 3)},
		{http2.FrameRSTStream, 0, 1, make([]byte, 5)},
		{http2.FrameData, 0, 1, make([]byte, 16<<10+1)},
		{0xee, 0xff, 5, []byte("unknown")},
		{http2.FramePushPromise, http2.FlagPushPromiseEndHeaders, 1, []byte{0, 0, 0, 2}},
		{http2.FrameData, http2.FlagDataPadded, 1, []byte{200, 'x'}},
	} {
		add(func(fr *http2.Framer, hdrs func(string, ...string) []byte) {
			w(fr.WriteSettings())
			headers(fr, 1, hdrs(unary), false)
			w(fr.WriteRawFrame(raw.t, raw.flags, raw.id, raw.payload))
		})
	}
	// A first frame that is not SETTINGS; a frame header cut short.
	add(func(fr *http2.Framer, hdrs func(string, ...string) []byte) {
		w(fr.WritePing(false, [8]byte{}))
	})
	seeds = append(seeds, []byte{0, 0, 18, 4, 0, 0, 0, 0, 0, 0, 3})
	// Header blocks that do not decode, or break the rules of requests.
	add(func(fr *http2.Framer, hdrs func(string, ...string) []byte) {
		w(fr.WriteSettings())
		headers(fr, 1, []byte{0xff, 0xff, 0xff, 0xff}, true) // an index past the table
		headers(fr, 3, []byte{0x3f, 0xe1, 0x1f}, true)       // a table size update past the limit
	})
	add(func(fr *http2.Framer, hdrs func(string, ...string) []byte) {
		w(fr.WriteSettings())
		headers(fr, 1, hdrs(unary, ":method", "GET", "connection", "close", "Upper", "x"), true)
		headers(fr, 3, hdrs(unary, "grpc-timeout", "nonsense", "content-type", "text/plain"), true)
		big := strings.Repeat("b", 20<<10) // four of them: past MaxHeaderListSize
		headers(fr, 5, hdrs(unary, "x-1", big, "x-2", big, "x-3", big, "x-4", big), true)
	})
	if writeErr != nil {
		return nil, fmt.Errorf("building the seeds: %w", writeErr)
	}
	return seeds, nil
}
