package statsd

import (
	"context"
	"net"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/slidingwindow/ratelimit/internal/metrics"
)

// The tests log nowhere: gostats's sink goroutine outlives them.

func TestMain(m *testing.M) {
	// gostats's sink has no stop: its goroutine lives as long as the
	// process, and a flush it holds while it cannot connect ends at its
	// next retry.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/lyft/gostats.(*netSink).run"),
		goleak.IgnoreAnyFunction("github.com/lyft/gostats.(*netSink).Flush"))
}

// listener is a statsd server on loopback UDP.
type listener struct {
	conn *net.UDPConn
}

func listen(t *testing.T) *listener {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &listener{conn: conn}
}

// lines reads datagrams until done says the lines read so far are all,
// or 10 s pass, and returns the lines whose name starts with one of the
// prefixes.
func (l *listener) lines(t *testing.T, done func([]string) bool, prefixes ...string) []string {
	t.Helper()
	var got []string
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 64<<10)
	for !done(got) {
		if err := l.conn.SetReadDeadline(deadline); err != nil {
			t.Fatal(err)
		}
		n, err := l.conn.Read(buf)
		if err != nil {
			t.Fatalf("after %q: %v", got, err)
		}
		for line := range strings.SplitSeq(strings.TrimSuffix(string(buf[:n]), "\n"), "\n") {
			if slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(line, p) }) {
				got = append(got, line)
			}
		}
	}
	slices.Sort(got)
	return got
}

// flush runs s until its first flush is done: Run flushes when its
// context ends.
func flush(s *Sender) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.Run(ctx)
}

var timerLine = regexp.MustCompile(`^ratelimit_server\.ShouldRateLimit\.response_time\.__env=test:\d+\|ms$`)

// TestDecisionStats: the lines of one decision, an error of each kind, a
// config load, a global shadow-mode answer and a gRPC call are the
// reference's names, tags and types, counters sent as their gains since
// the last flush (nothing for a counter that gained nothing).
func TestDecisionStats(t *testing.T) {
	l := listen(t)
	s, err := New(l.conn.LocalAddr().String(), "udp", time.Hour, map[string]string{"env": "test"}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.NewWithStats(prometheus.NewRegistry(), s)
	// A cost of 3 on a limit of 10 holding 6: 3 within, 1 of them past
	// the near-limit share (8). The key is sanitized as the reference's.
	m.Descriptor("rl.user_a:b|c.ip_10.0.0.1", "rl.user.ip").Hits(3, 10, 6, true, false, 0.8)
	m.StoreCall(time.Millisecond, "timeout")
	m.InvalidRequest("empty_domain")
	m.ConfigLoaded(1, "hash", "", "")
	m.GlobalShadowMode()
	m.DomainNotFound("nope\nx:1|c", 2) // a client's domain ends no line
	call := &grpc.UnaryServerInfo{FullMethod: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"}
	if _, err := m.UnaryServerInterceptor()(context.Background(), nil, call, func(context.Context, any) (any, error) {
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	flush(s)
	want := []string{
		"ratelimit.service.call.should_rate_limit.redis_error.__env=test:1|c",
		"ratelimit.service.call.should_rate_limit.service_error.__env=test:1|c",
		"ratelimit.service.config_load_success.__env=test:1|c",
		"ratelimit.service.global_shadow_mode.__env=test:1|c",
		"ratelimit.service.rate_limit.nope_x_1_c.domain_not_found.__env=test:2|c",
		"ratelimit.service.rate_limit.rl.user_a_b_c.ip_10_0_0_1.near_limit.__env=test:1|c",
		"ratelimit.service.rate_limit.rl.user_a_b_c.ip_10_0_0_1.total_hits.__env=test:3|c",
		"ratelimit.service.rate_limit.rl.user_a_b_c.ip_10_0_0_1.within_limit.__env=test:3|c",
		"ratelimit_server.ShouldRateLimit.total_requests.__env=test:1|c",
	}
	all := func(got []string) bool { return len(got) >= len(want)+2 } // the timer and a runtime gauge
	got := l.lines(t, all, "ratelimit.service.", "ratelimit_server.", "ratelimit.go.numGoroutine")
	var rest []string
	var timer, runtime bool
	for _, line := range got {
		switch {
		case timerLine.MatchString(line):
			timer = true
		case strings.HasPrefix(line, "ratelimit.go.numGoroutine.__env=test:") && strings.HasSuffix(line, "|g"):
			runtime = true
		default:
			rest = append(rest, line)
		}
	}
	if !slices.Equal(rest, want) || !timer || !runtime {
		t.Fatalf("lines:\n%s\nwant:\n%s\nwith a response_time timer and the ratelimit.go.* gauges", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// A second decision: the counters send what they gained since.
	m.Descriptor("rl.user_a:b|c.ip_10.0.0.1", "rl.user.ip").Hits(2, 10, 9, false, true, 0.8)
	flush(s)
	want = []string{
		"ratelimit.service.rate_limit.rl.user_a_b_c.ip_10_0_0_1.near_limit.__env=test:1|c",
		"ratelimit.service.rate_limit.rl.user_a_b_c.ip_10_0_0_1.over_limit.__env=test:1|c",
		"ratelimit.service.rate_limit.rl.user_a_b_c.ip_10_0_0_1.shadow_mode.__env=test:1|c",
		"ratelimit.service.rate_limit.rl.user_a_b_c.ip_10_0_0_1.total_hits.__env=test:2|c",
	}
	if got := l.lines(t, func(got []string) bool { return len(got) >= len(want) }, "ratelimit.service."); !slices.Equal(got, want) {
		t.Fatalf("second flush:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestNoServer: over TCP with nothing listening, the stats are dropped:
// recording and Run's end go on.
func TestNoServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil { // nothing listens there now
		t.Fatal(err)
	}
	s, err := New(addr, "tcp", time.Millisecond, nil, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.NewWithStats(prometheus.NewRegistry(), s)
	m.Descriptor("rl.user", "rl.user").Hits(1, 10, 0, true, false, 0.8)
	flush(s)
}

func TestNewRefuses(t *testing.T) {
	for _, tc := range []struct{ addr, env, want string }{
		{"localhost", "", "missing port"},
		{"localhost:http", "", "not a port number"},
		{"localhost:0", "", "not a port number"},
		{"localhost:8125", "x", "GOSTATS_FLUSH_INTERVAL_SECONDS"},
	} {
		t.Setenv("GOSTATS_FLUSH_INTERVAL_SECONDS", tc.env)
		_, err := New(tc.addr, "udp", time.Second, nil, zap.NewNop())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%q) with GOSTATS_FLUSH_INTERVAL_SECONDS=%q: %v, want an error with %q", tc.addr, tc.env, err, tc.want)
		}
	}
}
