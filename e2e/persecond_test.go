package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	adminv1 "github.com/slidingwindow/ratelimit/proto/ratelimit/admin/v1"
)

// perSecondConfig has a limit per second and one per minute.
const perSecondConfig = `domain: persecond
descriptors:
  - key: fast
    rate_limit:
      unit: second
      requests_per_unit: 3
  - key: slow
    rate_limit:
      unit: minute
      requests_per_unit: 4
`

// perSecondEnv is the reference's environment with REDIS_PERSECOND: the
// limits of unit second on perSecond, the others on main.
func perSecondEnv(main, perSecond, root string) map[string]string {
	return map[string]string{
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": main,
		"REDIS_PERSECOND": "true", "REDIS_PERSECOND_SOCKET_TYPE": "tcp", "REDIS_PERSECOND_URL": perSecond,
		"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false", "RUNTIME_IGNOREDOTFILES": "true",
		"USE_STATSD": "false", "LOG_LEVEL": "info",
	}
}

// askPerSecond asks for the descriptors key=value..., one entry each.
func (r *referenceReplica) askPerSecond(ctx context.Context, kv ...string) (*rlsv3.RateLimitResponse, error) {
	req := request("persecond")
	for i := 0; i < len(kv); i += 2 {
		req.Descriptors = append(req.Descriptors, descriptor(kv[i], kv[i+1]))
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return r.rls.ShouldRateLimit(ctx, req)
}

// insecureConn is a gRPC connection to addr without TLS, closed when the
// test ends.
func insecureConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// keysWith are the keys of r that contain part.
func keysWith(t *testing.T, r *redisServer, part string) []string {
	t.Helper()
	keys, err := r.client.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(keys, func(k string) bool { return !strings.Contains(k, part) })
}

// expiredKeys is the number of keys r's Redis expired (INFO stats).
func expiredKeys(t *testing.T, r *redisServer) int {
	t.Helper()
	info, err := r.client.Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "expired_keys:"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("INFO stats %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("INFO stats has no expired_keys")
	return 0
}

// admitsPerSecond sends n requests for fast=value within one second, and
// returns how many were admitted; it tries again, with a new value, when
// the burst crossed a second's edge.
func admitsPerSecond(t *testing.T, replicas []*referenceReplica, value string, n int) int {
	t.Helper()
	for attempt := range 5 {
		waitUntil(nextEdge(time.Second))
		start := time.Now()
		admitted := 0
		for i := range n {
			resp, err := replicas[i%len(replicas)].askPerSecond(context.Background(), "fast", fmt.Sprintf("%s-%d", value, attempt))
			if err != nil {
				t.Fatal(err)
			}
			if resp.OverallCode == rlsv3.RateLimitResponse_OK {
				admitted++
			}
		}
		if time.Now().Truncate(time.Second).Equal(start.Truncate(time.Second)) {
			return admitted
		}
	}
	t.Fatal("no burst of requests fitted in one second in 5 attempts")
	return 0
}

// TestPerSecondRedis: run with the reference's environment and
// REDIS_PERSECOND=true, the service counts a per-second limit only on the
// per-second Redis and a per-minute limit only on the main one, and both
// limits hold; the admin API finds the per-second counter there. With the per-second Redis down, only the per-second rule answers by its
// failure mode (the reference's environment names none: the call fails,
// for Envoy's failure_mode_deny to decide).
func TestPerSecondRedis(t *testing.T) {
	t.Parallel()
	main, perSecond := startRedis(t), startRedis(t)
	root := t.TempDir()
	configMapDir(t, root, "config.yaml", perSecondConfig)
	env := perSecondEnv(main.addr, perSecond.addr, root)
	adminAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	env["RATELIMIT_ADMIN_ADDR"] = adminAddr
	s := startReference(t, env)
	s.waitHealthcheck(t, http.StatusOK)
	ctx := context.Background()

	if got := admitsPerSecond(t, []*referenceReplica{s}, "a", 5); got != 3 {
		t.Fatalf("per-second limit of 3: %d admitted within one second", got)
	}
	awayFromEdge(time.Minute, 10*time.Second) // a fixed window: the five in one minute
	for i := 1; i <= 5; i++ {
		resp, err := s.askPerSecond(ctx, "slow", "b")
		if err != nil {
			t.Fatal(err)
		}
		if want := i <= 4; (resp.OverallCode == rlsv3.RateLimitResponse_OK) != want {
			t.Fatalf("per-minute request %d: %v", i, resp.OverallCode)
		}
	}
	if k := keysWith(t, main, "fast"); len(k) != 0 {
		t.Errorf("per-second counters on the main Redis: %q", k)
	}
	if k := keysWith(t, perSecond, "slow"); len(k) != 0 {
		t.Errorf("per-minute counters on the per-second Redis: %q", k)
	}
	// The per-second counters live a second: on a loaded machine the burst
	// can be past that, and Redis's count of expired keys tells that they
	// were written (nothing else writes to the per-second Redis).
	if (len(keysWith(t, perSecond, "fast")) == 0 && expiredKeys(t, perSecond) == 0) || len(keysWith(t, main, "slow")) == 0 {
		t.Fatalf("counters missing: per-second Redis %q (%d expired), main %q",
			keysWith(t, perSecond, ""), expiredKeys(t, perSecond), keysWith(t, main, ""))
	}

	// The admin API inspects and resets a per-second counter on its Redis.
	admin := adminv1.NewAdminClient(insecureConn(t, adminAddr))
	checked := false
	for attempt := 0; attempt < 5 && !checked; attempt++ {
		waitUntil(nextEdge(time.Second))
		start := time.Now()
		entries := []*adminv1.Entry{{Key: "fast", Value: fmt.Sprintf("admin-%d", attempt)}}
		if _, err := s.askPerSecond(ctx, "fast", entries[0].Value); err != nil {
			t.Fatal(err)
		}
		got, err := admin.Inspect(ctx, &adminv1.InspectRequest{Domain: "persecond", Entries: entries})
		if err != nil {
			t.Fatal(err)
		}
		reset, err := admin.Reset(ctx, &adminv1.ResetRequest{Domain: "persecond", Entries: entries})
		if err != nil {
			t.Fatal(err)
		}
		if !time.Now().Truncate(time.Second).Equal(start.Truncate(time.Second)) {
			continue // the window moved on meanwhile
		}
		// Reset leaves a reference key at 0 (its expiry a millisecond on,
		// which give-backs check), or it has expired since.
		emptied := true
		for _, k := range keysWith(t, perSecond, entries[0].Value) {
			if v, err := perSecond.client.Get(ctx, k).Result(); err == nil && v != "0" {
				emptied = false
			}
		}
		if got.Used != 1 || got.Remaining != 2 || reset.Deleted != 1 || !emptied {
			t.Fatalf("Inspect %v, Reset %v, per-second Redis %q: want 1 used, the counter reset to 0",
				got, reset, keysWith(t, perSecond, ""))
		}
		checked = true
	}
	if !checked {
		t.Fatal("no Inspect and Reset fitted in one second in 5 attempts")
	}

	perSecond.stop()
	if resp, err := s.askPerSecond(ctx, "slow", "d"); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("per-minute request with the per-second Redis down: %v, %v", resp, err)
	}
	if _, err := s.askPerSecond(ctx, "fast", "d"); status.Code(err) != codes.Unavailable {
		t.Fatalf("per-second request with its Redis down: %v, want UNAVAILABLE", err)
	}
}

// TestPerSecondRedisIncompleteRefusesToStart: REDIS_PERSECOND=true without
// REDIS_PERSECOND_URL does not start (the reference would dial its default
// socket and fail each per-second request).
func TestPerSecondRedisIncompleteRefusesToStart(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	configMapDir(t, root, "config.yaml", perSecondConfig)
	env := perSecondEnv("127.0.0.1:1", "", root)
	delete(env, "REDIS_PERSECOND_URL")
	s := startReference(t, env)
	select {
	case err := <-s.exited:
		s.exited <- err // for the cleanup
		if err == nil {
			t.Fatal("exited without an error")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("still running")
	}
	if !strings.Contains(s.logs.String(), "REDIS_PERSECOND_URL is not set") {
		t.Fatalf("output %q", s.logs)
	}
}

// TestPerSecondRedisLikeUpstream: envoyproxy/ratelimit itself, with the
// same environment and config, puts its counters where this service does:
// the per-second rule's on the per-second Redis only, the per-minute
// rule's on the main one only.
func TestPerSecondRedisLikeUpstream(t *testing.T) {
	t.Parallel()
	main, perSecond := startRedis(t), startRedis(t)
	root := t.TempDir()
	configMapDir(t, root, "config.yaml", perSecondConfig)
	u := startUpstream(t, perSecondEnv(main.addr, perSecond.addr, root))
	u.waitHealthcheck(t, http.StatusOK)
	resp, err := u.askPerSecond(context.Background(), "fast", "a", "slow", "b")
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("upstream: %v, %v", resp, err)
	}
	if len(keysWith(t, main, "fast")) != 0 || len(keysWith(t, perSecond, "slow")) != 0 ||
		len(keysWith(t, perSecond, "fast")) != 1 || len(keysWith(t, main, "slow")) != 1 {
		t.Fatalf("upstream's counters: main Redis %q, per-second Redis %q", keysWith(t, main, ""), keysWith(t, perSecond, ""))
	}
}

// TestPerSecondRedisRefusingTheCredentialsIsNotReady: the per-second Redis
// is asked for readiness as the main one is: while it refuses
// REDIS_PERSECOND_AUTH, the service is not ready; once it accepts it, the
// service is, and counts there.
func TestPerSecondRedisRefusingTheCredentialsIsNotReady(t *testing.T) {
	t.Parallel()
	main, perSecond := startRedis(t), startRedis(t)
	ctx := context.Background()
	if err := perSecond.client.ConfigSet(ctx, "requirepass", "right").Err(); err != nil {
		t.Fatal(err)
	}
	admin := redis.NewClient(&redis.Options{Addr: perSecond.addr, Password: "right"})
	defer admin.Close()
	root := t.TempDir()
	configMapDir(t, root, "config.yaml", perSecondConfig)
	env := perSecondEnv(main.addr, perSecond.addr, root)
	env["REDIS_PERSECOND_AUTH"] = "wrong-password"
	s := startReference(t, env)
	s.waitHealthcheck(t, http.StatusInternalServerError)
	if err := admin.ConfigSet(ctx, "requirepass", "wrong-password").Err(); err != nil {
		t.Fatal(err)
	}
	s.waitHealthcheck(t, http.StatusOK)
	if resp, err := s.askPerSecond(ctx, "fast", "a"); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("per-second request: %v, %v", resp, err)
	}
	admin = redis.NewClient(&redis.Options{Addr: perSecond.addr, Password: "wrong-password"})
	defer admin.Close()
	if keys, err := admin.Keys(ctx, "*fast*").Result(); err != nil || len(keys) != 1 {
		t.Fatalf("per-second Redis keys %q, %v: want the counter", keys, err)
	}
	if strings.Contains(s.logs.String(), "wrong-password") {
		t.Fatal("the password is in the log")
	}
}

// TestPerSecondRedisTLS: REDIS_PERSECOND_TLS=true with the REDIS_TLS_*
// files reaches a per-second Redis that serves TLS only and asks for a
// client certificate, while the main Redis stays plaintext, as in the
// reference, whose one TLS config serves whichever Redis has TLS on.
func TestPerSecondRedisTLS(t *testing.T) {
	t.Parallel()
	perSecond, caFile, clientCert, clientKey := startTLSRedis(t)
	main := startRedis(t)
	root := t.TempDir()
	configMapDir(t, root, "config.yaml", perSecondConfig)
	env := perSecondEnv(main.addr, perSecond.addr, root)
	env["REDIS_PERSECOND_TLS"], env["REDIS_TLS_CACERT"] = "true", caFile
	env["REDIS_TLS_CLIENT_CERT"], env["REDIS_TLS_CLIENT_KEY"] = clientCert, clientKey
	s := startReference(t, env)
	s.waitHealthcheck(t, http.StatusOK)
	resp, err := s.askPerSecond(context.Background(), "fast", "tls", "slow", "plain")
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("request: %v, %v", resp, err)
	}
	if len(keysWith(t, perSecond, "fast")) != 1 || len(keysWith(t, main, "slow")) != 1 {
		t.Fatalf("counters: per-second Redis (TLS) %q, main %q", keysWith(t, perSecond, ""), keysWith(t, main, ""))
	}
}

// TestPerSecondRedisMixedFleet: envoyproxy/ratelimit and this service, both
// with REDIS_PERSECOND=true on the same two Redis, share the per-second
// counter (the reference's keys, on the per-second Redis) and admit exactly
// its limit between them.
func TestPerSecondRedisMixedFleet(t *testing.T) {
	t.Parallel()
	main, perSecond := startRedis(t), startRedis(t)
	root := t.TempDir()
	configMapDir(t, root, "config.yaml", perSecondConfig)
	ours := startReference(t, perSecondEnv(main.addr, perSecond.addr, root))
	theirs := startUpstream(t, perSecondEnv(main.addr, perSecond.addr, root))
	ours.waitHealthcheck(t, http.StatusOK)
	theirs.waitHealthcheck(t, http.StatusOK)
	if got := admitsPerSecond(t, []*referenceReplica{ours, theirs}, "mixed", 8); got != 3 {
		t.Fatalf("per-second limit of 3 over both: %d admitted within one second", got)
	}
	if keys := keysWith(t, main, "fast"); len(keys) != 0 {
		t.Fatalf("per-second counters on the main Redis: %q", keys)
	}
	if keys := keysWith(t, perSecond, "fast"); len(keys) == 0 {
		t.Fatal("no per-second counter on the per-second Redis")
	}
}
