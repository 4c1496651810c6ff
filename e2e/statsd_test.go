package e2e

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// statsdServer is a statsd server on loopback UDP: the stats it received,
// by name (tags included), with their type, and the counters' sums.
type statsdServer struct {
	conn   *net.UDPConn
	mu     sync.Mutex
	stats  map[string]string // name → type (c, g, ms)
	counts map[string]uint64 // counter name → the sum of what was sent
}

func startStatsd(t *testing.T) *statsdServer {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	s := &statsdServer{conn: conn, stats: map[string]string{}, counts: map[string]uint64{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return // closed
			}
			s.mu.Lock()
			for line := range strings.SplitSeq(strings.TrimSpace(string(buf[:n])), "\n") {
				// name:value|type
				if i := strings.LastIndexByte(line, ':'); i > 0 {
					value, typ, _ := strings.Cut(line[i+1:], "|")
					s.stats[line[:i]] = typ
					if n, err := strconv.ParseUint(value, 10, 64); err == nil && typ == "c" {
						s.counts[line[:i]] += n
					}
				}
			}
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = conn.Close() // ends the reader, which is all it is for
		<-done
	})
	return s
}

func (s *statsdServer) port() string {
	return strconv.Itoa(s.conn.LocalAddr().(*net.UDPAddr).Port)
}

// received is a copy of the stats received so far.
func (s *statsdServer) received() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string, len(s.stats))
	for k, v := range s.stats {
		out[k] = v
	}
	return out
}

// counters are the sums of the counters whose names start with one of
// prefixes.
func (s *statsdServer) counters(prefixes ...string) map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]uint64{}
	for name, n := range s.counts {
		if slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
			out[name] = n
		}
	}
	return out
}

// waitStats waits until every stat of want has come, with its type.
func (s *statsdServer) waitStats(t *testing.T, want map[string]string) {
	t.Helper()
	waitFor(t, 30*time.Second, func() error {
		got := s.received()
		var missing []string
		for name, typ := range want {
			if got[name] != typ {
				missing = append(missing, name+"|"+typ)
			}
		}
		if len(missing) > 0 {
			slices.Sort(missing)
			return fmt.Errorf("not received: %s", strings.Join(missing, ", "))
		}
		return nil
	})
}

const statsdConfig = `domain: rl
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// statsdEnv is the reference's environment sending its stats to port over
// UDP (gostats's STATSD_PROTOCOL) every 100 ms, tagged env=e2e, reading a
// ConfigMap's directory as Istio and Envoy Gateway do (dot files skipped).
func statsdEnv(redisAddr, root, port string) map[string]string {
	return map[string]string{
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": redisAddr, "RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit",
		// A ConfigMap layout holds each file twice: both services refuse it
		// unless dot directories are skipped.
		"RUNTIME_IGNOREDOTFILES": "true", "USE_STATSD": "true", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": port,
		"STATSD_PROTOCOL": "udp", "STATS_FLUSH_INTERVAL": "100ms", "EXTRA_TAGS": "env:e2e",
	}
}

// askForStats makes the decisions whose stats the tests expect: user
// alice three times on a limit of 2 (within, near, over), a detailed_metric
// rule, a shadow_mode rule twice on a limit of 1, two descriptors of an
// unknown domain, and a request without a domain (refused). The limits
// are per minute, in fixed windows: the decisions keep off a minute's edge.
func askForStats(t *testing.T, r *referenceReplica) {
	t.Helper()
	awayFromEdge(time.Minute, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, tc := range []struct {
		req  *rlsv3.RateLimitRequest
		want rlsv3.RateLimitResponse_Code
	}{
		{request("rl", descriptor("user", "alice")), rlsv3.RateLimitResponse_OK},
		{request("rl", descriptor("user", "alice")), rlsv3.RateLimitResponse_OK},
		{request("rl", descriptor("user", "alice")), rlsv3.RateLimitResponse_OVER_LIMIT},
		{request("rl", descriptor("path", "/a")), rlsv3.RateLimitResponse_OK},
		{request("rl", descriptor("shadow", "x")), rlsv3.RateLimitResponse_OK},
		{request("rl", descriptor("shadow", "x")), rlsv3.RateLimitResponse_OK},
		{request("nope", descriptor("user", "alice"), descriptor("path", "/a")), rlsv3.RateLimitResponse_OK},
	} {
		resp, err := r.rls.ShouldRateLimit(ctx, tc.req)
		if err != nil || resp.OverallCode != tc.want {
			t.Fatalf("request %d: %v, %v; want %v", i, resp, err, tc.want)
		}
	}
	if _, err := r.rls.ShouldRateLimit(ctx, request("", descriptor("user", "alice"))); err == nil {
		t.Fatal("a request without a domain was answered")
	}
}

// referenceStats are the stats the reference sends for askForStats: per
// rule and per call, counters but for the response time.
var referenceStats = func() map[string]string {
	want := map[string]string{
		"ratelimit.service.call.should_rate_limit.service_error.__env=e2e": "c",
		"ratelimit.service.config_load_success.__env=e2e":                  "c",
		"ratelimit_server.ShouldRateLimit.total_requests.__env=e2e":        "c",
		"ratelimit_server.ShouldRateLimit.response_time.__env=e2e":         "ms",
		"ratelimit.go.numGoroutine.__env=e2e":                              "g",
	}
	for key, stats := range map[string][]string{
		"rl.user":    {"total_hits", "within_limit", "near_limit", "over_limit"},
		"rl.path_/a": {"total_hits", "within_limit"},
		"rl.shadow":  {"total_hits", "within_limit", "near_limit", "over_limit", "shadow_mode"},
	} {
		for _, stat := range stats {
			want["ratelimit.service.rate_limit."+key+"."+stat+".__env=e2e"] = "c"
		}
	}
	return want
}()

// TestReferenceStatsd: started with the reference's environment and
// USE_STATSD=true, the service sends the reference's stats for its
// decisions to STATSD_HOST:STATSD_PORT, over UDP as STATSD_PROTOCOL says.
func TestReferenceStatsd(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	root := t.TempDir()
	configMapDir(t, root, "config.yaml", statsdConfig)
	statsd := startStatsd(t)
	s := startReference(t, statsdEnv(r.addr, root, statsd.port()))
	s.waitHealthcheck(t, http.StatusOK)
	askForStats(t, s)
	statsd.waitStats(t, referenceStats)
}

// statsdMissing are the reference's stats this service does not send, by
// name prefix, with why.
var statsdMissing = map[string]string{
	"ratelimit.redis_pool.": "the reference's radix pool (cx_active, cx_total, cx_local_close); the Redis client here is go-redis, " +
		"with no such pool",
	"runtime.": "goruntime's config loader (load_attempts, load_failures, num_values); config loads are counted in " +
		"ratelimit.service.config_load_success and config_load_error",
}

// TestReferenceStatsdMatchesUpstream: for the same requests, the stats this
// service sends include every one envoyproxy/ratelimit itself sends, but
// those of statsdMissing, and its per-rule and per-call counters sum to the
// same counts.
func TestReferenceStatsdMatchesUpstream(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	// A plain directory: the reference reads a ConfigMap's ..data directory
	// too, and refuses its second copy of the domain.
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "config.yaml"), statsdConfig)
	ourStatsd, upstreamStatsd := startStatsd(t), startStatsd(t)
	ours := startReference(t, statsdEnv(startRedis(t).addr, root, ourStatsd.port()))
	upstream := startUpstream(t, statsdEnv(startRedis(t).addr, root, upstreamStatsd.port()))
	ours.waitHealthcheck(t, http.StatusOK)
	upstream.waitHealthcheck(t, http.StatusOK)
	askForStats(t, ours)
	askForStats(t, upstream)
	upstreamStatsd.waitStats(t, referenceStats) // the oracle sends what the other test expects
	ourStatsd.waitStats(t, referenceStats)

	got := ourStatsd.received()
	for name, typ := range upstreamStatsd.received() {
		if got[name] != typ && !allowedMissing(name) {
			t.Errorf("envoyproxy/ratelimit sends %s|%s, this service does not (type here: %q)", name, typ, got[name])
		}
	}
	// Counters come as deltas, over flushes: their sums settle.
	prefixes := []string{"ratelimit.service.", "ratelimit_server."}
	waitFor(t, 30*time.Second, func() error {
		want, got := upstreamStatsd.counters(prefixes...), ourStatsd.counters(prefixes...)
		if !maps.Equal(got, want) {
			return fmt.Errorf("counts\n%v\nenvoyproxy/ratelimit's\n%v", got, want)
		}
		return nil
	})
}

func allowedMissing(name string) bool {
	for prefix := range statsdMissing {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}

// TestReferenceStatsdNobodyListening: with the reference's environment and
// USE_STATSD unset (true, as there), the stats go over TCP to
// STATSD_HOST:STATSD_PORT; with nothing listening they are dropped, the
// service answers, and SIGTERM ends it cleanly.
func TestReferenceStatsdNobodyListening(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	root := t.TempDir()
	configMapDir(t, root, "config.yaml", statsdConfig)
	env := statsdEnv(r.addr, root, strconv.Itoa(freePort(t)))
	for _, name := range []string{"USE_STATSD", "STATSD_PROTOCOL"} {
		delete(env, name)
	}
	s := startReference(t, env)
	s.waitHealthcheck(t, http.StatusOK)
	askForStats(t, s)
	waitFor(t, 20*time.Second, func() error {
		if !strings.Contains(s.logs.String(), "connection error") {
			return errors.New("no statsd connection attempt logged")
		}
		return nil
	})
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitCleanExit(t, s.exited)
}
