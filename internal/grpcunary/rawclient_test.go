package grpcunary

// Helpers of the tests that drive the server by hand: a raw HTTP/2 client,
// a server on a loopback port, and waiting for a condition.

import (
	"bytes"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/protobuf/proto"

	"github.com/slidingwindow/ratelimit/internal/waitfor"
)

// rawClient is a hand-driven HTTP/2 client.
type rawClient struct {
	nc   net.Conn
	fr   *http2.Framer
	hbuf bytes.Buffer
	henc *hpack.Encoder
}

func dialRaw(t *testing.T, addr string, settings ...http2.Setting) *rawClient {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	rc := &rawClient{nc: nc, fr: http2.NewFramer(nc, nc)}
	rc.henc = hpack.NewEncoder(&rc.hbuf)
	if _, err := nc.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := rc.fr.WriteSettings(settings...); err != nil {
		t.Fatal(err)
	}
	return rc
}

func (rc *rawClient) headers(t *testing.T, id uint32, path string, endStream bool, extra ...hpack.HeaderField) {
	t.Helper()
	rc.hbuf.Reset()
	for _, f := range append([]hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: path}, {Name: ":authority", Value: "x"},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	}, extra...) {
		rc.henc.WriteField(f)
	}
	hf := http2.HeadersFrameParam{StreamID: id, BlockFragment: rc.hbuf.Bytes(), EndHeaders: true, EndStream: endStream}
	if err := rc.fr.WriteHeaders(hf); err != nil {
		t.Fatal(err)
	}
}

// await reads what the server sends on rc until the connection ends, and
// closes the channel it returns at the first frame match accepts.
func (rc *rawClient) await(match func(http2.Frame) bool) <-chan struct{} {
	seen := make(chan struct{})
	go func() {
		matched := false
		for {
			f, err := rc.fr.ReadFrame()
			if err != nil {
				return
			}
			if !matched && match(f) {
				matched = true
				close(seen)
			}
		}
	}()
	return seen
}

// resetOf matches an RST_STREAM of stream id.
func resetOf(id uint32) func(http2.Frame) bool {
	return func(f http2.Frame) bool {
		r, ok := f.(*http2.RSTStreamFrame)
		return ok && r.StreamID == id
	}
}

// refusal matches a stream refused: REFUSED_STREAM, or answered with a
// status alone (trailers-only, as RESOURCE_EXHAUSTED).
func refusal(f http2.Frame) bool {
	r, reset := f.(*http2.RSTStreamFrame)
	h, answered := f.(*http2.HeadersFrame)
	return reset && r.ErrCode == http2.ErrCodeRefusedStream || answered && h.StreamEnded()
}

func grpcMsg(m proto.Message) []byte {
	b, _ := proto.Marshal(m)
	n := len(b)
	return append([]byte{0, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, b...)
}

func serveRaw(t *testing.T, opts Options, svc *testService, setup ...func(*Server)) (*Server, string) {
	s := NewServer(opts)
	for _, f := range setup {
		f(s)
	}
	testgrpc.RegisterTestServiceServer(s, svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveTillCleanup(t, s, ln)
	return s, ln.Addr().String()
}

// serveTillCleanup serves ln with s until the test ends, then stops s and
// checks that Serve ended for the stop.
func serveTillCleanup(t *testing.T, s *Server, ln net.Listener) {
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Stop()
		if err := <-served; !errors.Is(err, ErrServerStopped) {
			t.Errorf("Serve: %v, want ErrServerStopped", err)
		}
	})
}

func countingAdmit(admitted, done *atomic.Int32) func() AdmitFunc {
	return func() AdmitFunc {
		return func(string) (func(), error) {
			admitted.Add(1)
			return func() { done.Add(1) }, nil
		}
	}
}

// waitFor polls cond for up to d: generous bounds, for what the defects
// made never happen, not latency targets.
func waitFor(cond func() bool, d time.Duration) bool {
	return waitfor.True(d, 5*time.Millisecond, cond)
}
