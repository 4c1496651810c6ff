// Package h2attack is an HTTP/2 client that misbehaves on purpose, for
// e2e's TestAttack (which make bench-attacks also runs as a measurement):
// each attack is one function that speaks HTTP/2 badly to the service's
// gRPC port, written with golang.org/x/net/http2's Framer and hpack so that
// every byte on the wire is chosen here rather than by a well-behaved
// transport.
//
// Every attack makes the call a gRPC client makes to ask for a rate limit
// decision (a unary POST to ShouldRateLimit with grpc-go's headers), so
// that the server's gRPC path is what is attacked, not its refusal of
// requests that are not gRPC. An attack runs until its context ends and
// returns a Result: what it sent, and how the server answered (closed
// connections, GOAWAY codes, reset streams).
//
// Legit is the other side of a test: well-behaved clients, made with
// grpc-go, whose calls the service must keep answering while an attack
// runs.
package h2attack

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/proto"
)

// Method is the gRPC method every attack calls.
const Method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// HugeTimeout is a grpc-timeout as long as the header allows in seconds
// (eight digits): a server that trusts it keeps the call for years.
const HugeTimeout = "99999999S"

// Call is the rate limit request an attack sends: one descriptor of one
// entry. Its zero value asks for domain "attack", key "k", value
// "attacker".
type Call struct {
	Domain, Key, Value string
}

func (c Call) withDefaults() Call {
	if c.Domain == "" {
		c.Domain = "attack"
	}
	if c.Key == "" {
		c.Key = "k"
	}
	if c.Value == "" {
		c.Value = "attacker"
	}
	return c
}

// request is c as a RateLimitRequest.
func (c Call) request() *rlsv3.RateLimitRequest {
	c = c.withDefaults()
	return &rlsv3.RateLimitRequest{
		Domain: c.Domain,
		Descriptors: []*rlcommon.RateLimitDescriptor{{
			Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: c.Key, Value: c.Value}},
		}},
	}
}

// message is c as a gRPC message: the 5-byte prefix (not compressed,
// length) and the encoded request. A size larger than the request pads
// its value so that the message is that long.
func (c Call) message(size int) ([]byte, error) {
	c = c.withDefaults()
	b, err := proto.Marshal(c.request())
	if err != nil {
		return nil, fmt.Errorf("encoding the request: %w", err)
	}
	if pad := size - 5 - len(b); pad > 0 {
		// The value's length prefix may grow a byte or two with it.
		c.Value += strings.Repeat("p", pad)
		for {
			if b, err = proto.Marshal(c.request()); err != nil {
				return nil, fmt.Errorf("encoding the request: %w", err)
			}
			if 5+len(b) <= size || len(c.Value) == 0 {
				break
			}
			c.Value = c.Value[:len(c.Value)-1]
		}
	}
	return grpcFrame(b, len(b)), nil
}

// grpcFrame prefixes body with gRPC's message header announcing length
// bytes, which may be more than body holds.
func grpcFrame(body []byte, length int) []byte {
	out := make([]byte, 5, 5+len(body))
	out[1], out[2], out[3], out[4] = byte(length>>24), byte(length>>16), byte(length>>8), byte(length)
	return append(out, body...)
}

// Result is what an attack did and what the server did about it.
type Result struct {
	// Conns is the connections dialed.
	Conns int64
	// Streams is the streams opened.
	Streams int64
	// Frames and Bytes are what was written (Bytes counts the client
	// prefaces too).
	Frames, Bytes int64
	// Resets is the RST_STREAM frames the server sent.
	Resets int64
	// Answers is the streams the server ended (END_STREAM), answered or
	// refused.
	Answers int64
	// Closed is the connections the server ended before the attack did.
	Closed int64
	// FirstClose is when the first of those ended, from the attack's
	// start; zero when none did.
	FirstClose time.Duration
	// GoAways counts the GOAWAY frames received by error code.
	GoAways map[http2.ErrCode]int
	// Err is the first error that kept the attack from going on as meant,
	// such as a failed dial; the server closing a connection is not one.
	Err error
}

// GoAway reports whether a GOAWAY with code came.
func (r Result) GoAway(code http2.ErrCode) bool {
	return r.GoAways[code] > 0
}

func (r Result) String() string {
	s := fmt.Sprintf("%d conns, %d streams, %d frames, %d bytes sent; %d resets, %d answers received",
		r.Conns, r.Streams, r.Frames, r.Bytes, r.Resets, r.Answers)
	if r.Closed > 0 {
		s += fmt.Sprintf("; %d closed by the server, the first after %v", r.Closed, r.FirstClose.Round(time.Millisecond))
	} else {
		s += "; none closed by the server"
	}
	for _, code := range slices.Sorted(maps.Keys(r.GoAways)) {
		s += fmt.Sprintf("; GOAWAY %v x%d", code, r.GoAways[code])
	}
	if r.Err != nil {
		s += "; error: " + r.Err.Error()
	}
	return s
}

// recorder gathers a Result from an attack's goroutines.
type recorder struct {
	start                                                  time.Time
	conns, streams, frames, bytes, resets, answers, closed atomic.Int64

	mu         sync.Mutex
	firstClose time.Duration
	goAways    map[http2.ErrCode]int
	err        error
}

func newRecorder() *recorder {
	return &recorder{start: time.Now(), goAways: map[http2.ErrCode]int{}}
}

// serverClosed notes a connection the server ended.
func (r *recorder) serverClosed() {
	after := time.Since(r.start)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed.Add(1) == 1 {
		r.firstClose = after
	}
}

func (r *recorder) goAway(code http2.ErrCode) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.goAways[code]++
}

// fail keeps the first error.
func (r *recorder) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
	}
}

func (r *recorder) result() Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return Result{
		Conns:      r.conns.Load(),
		Streams:    r.streams.Load(),
		Frames:     r.frames.Load(),
		Bytes:      r.bytes.Load(),
		Resets:     r.resets.Load(),
		Answers:    r.answers.Load(),
		Closed:     r.closed.Load(),
		FirstClose: r.firstClose,
		GoAways:    maps.Clone(r.goAways),
		Err:        r.err,
	}
}
