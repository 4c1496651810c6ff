package h2attack

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
)

// okService answers every call OK.
type okService struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (okService) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// serve runs okService on a loopback port: grpc-go's handler on x/net's
// HTTP/2 server, whose checks of the protocol are the reference the
// attackers are held to (GOAWAY codes, a deadline for the client's
// SETTINGS).
func serve(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, okService{})
	// x/net's server, at the version go.mod pins, is the reference: net/http's
	// bundled copy, which the deprecation points to, follows the Go release.
	h2 := &http2.Server{} //nolint:staticcheck // SA1019: see above
	// The connection errors the attacks cause are expected.
	quiet := &http.Server{ErrorLog: log.New(io.Discard, "", 0)}
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go h2.ServeConn(nc, &http2.ServeConnOpts{Handler: gs, BaseConfig: quiet}) //nolint:staticcheck // SA1019: as h2
		}
	}()
	t.Cleanup(func() {
		if err := ln.Close(); err != nil {
			t.Error(err)
		}
		gs.Stop()
	})
	return ln.Addr().String()
}

// TestAttacksSpeakHTTP2 checks the attackers themselves, against a
// reference server: each dials, writes, and sees what it should of the
// server; the ones that break the protocol get their connection closed
// with the GOAWAY code HTTP/2 says; and the legitimate clients are
// answered beside them.
func TestAttacksSpeakHTTP2(t *testing.T) {
	addr := serve(t)
	// x/net's server closes a connection a second after its GOAWAY; on a
	// busy machine, later (over 3 s once, in a loaded make test).
	const afterGoAway = 8 * time.Second
	cases := []struct {
		name   string
		attack func(ctx context.Context, addr string) Result
		closed bool // the server must close a connection
		goAway http2.ErrCode
		runFor time.Duration // default 500 ms
	}{
		{"trickle", func(ctx context.Context, addr string) Result {
			return Trickle(ctx, addr, TrickleOptions{Streams: 50, Interval: 100 * time.Millisecond})
		}, false, 0, 0},
		{"headers only", func(ctx context.Context, addr string) Result {
			return HeadersOnly(ctx, addr, HeadersOnlyOptions{Conns: 2, Streams: 50})
		}, false, 0, 0},
		{"length prefix", func(ctx context.Context, addr string) Result {
			return LengthPrefix(ctx, addr, LengthPrefixOptions{Streams: 50})
		}, false, 0, 0},
		{"zero window", func(ctx context.Context, addr string) Result {
			return ZeroWindow(ctx, addr, ZeroWindowOptions{Streams: 50})
		}, false, 0, 0},
		{"rapid reset", func(ctx context.Context, addr string) Result {
			return RapidReset(ctx, addr, RapidResetOptions{Message: true})
		}, false, 0, 0},
		{"hpack bomb", func(ctx context.Context, addr string) Result {
			return HPACKBomb(ctx, addr, HPACKBombOptions{})
		}, false, 0, 0},
		{"continuation", func(ctx context.Context, addr string) Result {
			return Continuation(ctx, addr, ContinuationOptions{})
		}, true, http2.ErrCodeProtocol, afterGoAway},
		{"ping flood", func(ctx context.Context, addr string) Result {
			return Flood(ctx, addr, FloodOptions{Peers: 4, Frame: FloodPing})
		}, false, 0, 0},
		{"preface only", func(ctx context.Context, addr string) Result {
			return PrefaceOnly(ctx, addr, PrefaceOnlyOptions{})
		}, true, 0, 3 * time.Second}, // x/net waits 2 s for the SETTINGS
		{"oversized frame", func(ctx context.Context, addr string) Result {
			return OversizedFrame(ctx, addr, OversizedFrameOptions{})
		}, true, http2.ErrCodeFrameSize, afterGoAway},
		{"DATA on stream 0", func(ctx context.Context, addr string) Result {
			return Invalid(ctx, addr, InvalidOptions{Frame: DataOnStreamZero})
		}, true, http2.ErrCodeProtocol, afterGoAway},
		{"HEADERS on an even stream", func(ctx context.Context, addr string) Result {
			return Invalid(ctx, addr, InvalidOptions{Frame: HeadersOnEvenStream})
		}, true, http2.ErrCodeProtocol, afterGoAway},
		{"WINDOW_UPDATE of 0", func(ctx context.Context, addr string) Result {
			return Invalid(ctx, addr, InvalidOptions{Frame: WindowUpdateZero})
		}, true, http2.ErrCodeProtocol, afterGoAway},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Side by side: most of the cases wait for the server to close a
			// connection, and each has connections of its own.
			t.Parallel()
			dialCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			legit, err := DialLegit(dialCtx, addr, Call{})
			if err != nil {
				t.Fatal(err)
			}
			defer legit.Close()
			ctx, cancel := context.WithTimeout(context.Background(), max(tc.runFor, 500*time.Millisecond))
			defer cancel()
			done := make(chan Result, 1)
			go func() { done <- tc.attack(ctx, addr) }()
			lr := legit.Run(ctx, LegitOptions{Callers: 2})
			res := <-done
			t.Logf("attack: %v", res)
			t.Logf("legit: %v", lr)
			if res.Err != nil || res.Conns == 0 || res.Bytes <= 24 && tc.name != "preface only" {
				t.Errorf("the attack did not run: %v", res)
			}
			if tc.closed && res.Closed == 0 {
				t.Errorf("no connection closed by the server: %v", res)
			}
			if tc.goAway != 0 && !res.GoAway(tc.goAway) {
				t.Errorf("no GOAWAY %v: %v", tc.goAway, res)
			}
			if lr.Answered() == 0 {
				t.Errorf("no legitimate call answered: %v", lr)
			}
		})
	}
}

// TestMessage: the gRPC message is its request, prefixed, padded to the
// size asked.
func TestMessage(t *testing.T) {
	for _, size := range []int{0, 100, 4 << 10} {
		msg, err := Call{}.message(size)
		if err != nil {
			t.Fatal(err)
		}
		n := int(msg[1])<<24 | int(msg[2])<<16 | int(msg[3])<<8 | int(msg[4])
		if n != len(msg)-5 || msg[0] != 0 {
			t.Fatalf("size %d: prefix % x announces %d bytes, %d follow", size, msg[:5], n, len(msg)-5)
		}
		if size > 0 && len(msg) != size {
			t.Fatalf("size %d: a message of %d bytes", size, len(msg))
		}
	}
}
