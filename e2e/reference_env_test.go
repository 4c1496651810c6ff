package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// istioConfig is the ConfigMap of Istio's samples/ratelimit.
const istioConfig = `domain: echo-ratelimit
descriptors:
  - key: PATH
    value: "/"
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: PATH
    rate_limit:
      unit: minute
      requests_per_unit: 100
`

// referenceReplica is a binary run as envoyproxy/ratelimit is: no
// arguments, only the environment given (nothing of the test's). It is this
// service (startReference) or envoyproxy/ratelimit itself (startUpstream).
type referenceReplica struct {
	cmd                          *exec.Cmd
	grpcAddr, httpAddr, debugAdr string
	logs                         *syncBuffer
	exited                       chan error
	rls                          rlsv3.RateLimitServiceClient
	health                       healthpb.HealthClient
}

// startReference runs this service as the reference is run.
func startReference(t *testing.T, env map[string]string) *referenceReplica {
	t.Helper()
	return startReplica(t, binary, env)
}

func startReplica(t *testing.T, bin string, env map[string]string) *referenceReplica {
	t.Helper()
	ports := [3]int{freePort(t), freePort(t), freePort(t)}
	env["PORT"], env["GRPC_PORT"], env["DEBUG_PORT"] = strconv.Itoa(ports[0]), strconv.Itoa(ports[1]), strconv.Itoa(ports[2])
	r := &referenceReplica{
		httpAddr: "127.0.0.1:" + env["PORT"], grpcAddr: "127.0.0.1:" + env["GRPC_PORT"], debugAdr: "127.0.0.1:" + env["DEBUG_PORT"],
		logs: &syncBuffer{}, exited: make(chan error, 1),
	}
	r.cmd = exec.Command(bin)
	r.cmd.Env = []string{}
	for k, v := range env {
		r.cmd.Env = append(r.cmd.Env, k+"="+v)
	}
	r.cmd.Stdout, r.cmd.Stderr = r.logs, r.logs
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.exited <- r.cmd.Wait() }()
	t.Cleanup(func() {
		// It may have exited already (the exit error then tells why);
		// else the exit error is the kill's own. A test that cares about
		// the exit reads r.exited itself.
		_ = r.cmd.Process.Kill()
		exit := <-r.exited
		if t.Failed() {
			t.Logf("service exit: %v; output:\n%s", exit, r.logs)
		}
	})
	conn := insecureConn(t, r.grpcAddr)
	r.rls, r.health = rlsv3.NewRateLimitServiceClient(conn), healthpb.NewHealthClient(conn)
	return r
}

// healthcheck is GET /healthcheck: the status, or 0 when the port does not
// answer yet.
func (r *referenceReplica) healthcheck() (int, string) {
	resp, err := http.Get("http://" + r.httpAddr + "/healthcheck")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (r *referenceReplica) waitHealthcheck(t *testing.T, want int) {
	t.Helper()
	waitFor(t, 20*time.Second, func() error {
		select {
		case err := <-r.exited:
			r.exited <- err
			return fmt.Errorf("service exited: %v", err)
		default:
		}
		if code, body := r.healthcheck(); code != want {
			return fmt.Errorf("/healthcheck %d %q, want %d", code, body, want)
		}
		return nil
	})
}

func (r *referenceReplica) code(t *testing.T, path string) rlsv3.RateLimitResponse_Code {
	t.Helper()
	return r.ask(t, request("echo-ratelimit", descriptor("PATH", path))).OverallCode
}

// configMapDir lays out root/ratelimit/config as a Kubernetes ConfigMap
// volume does: the file is a symlink into a dot directory that a symlink
// ..data points to.
func configMapDir(t *testing.T, root, name, content string) {
	t.Helper()
	dir := filepath.Join(root, "ratelimit", "config")
	data := filepath.Join(dir, "..2026_11_24_07_00_00.000000001")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(data, name), content)
	for _, link := range [][2]string{{filepath.Base(data), "..data"}, {filepath.Join("..data", name), name}} {
		if err := os.Symlink(link[0], filepath.Join(dir, link[1])); err != nil {
			t.Fatal(err)
		}
	}
}

// istioEnv is the environment of Istio's samples/ratelimit/rate-limit-service.yaml,
// with the test's Redis and config root. Each replica adds its own PORT,
// GRPC_PORT and DEBUG_PORT: here two pods share one host.
func istioEnv(redisAddr, root string) map[string]string {
	return map[string]string{
		"LOG_LEVEL": "debug", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": redisAddr, "USE_STATSD": "false",
		"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false",
		"RUNTIME_IGNOREDOTFILES": "true", "HOST": "::", "GRPC_HOST": "::",
	}
}

// TestIstioSampleEnvironment: two replicas run as Istio's sample runs the
// reference, with only its environment and a ConfigMap-style directory,
// share the limits on the one Redis they are given.
func TestIstioSampleEnvironment(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	root := t.TempDir()
	configMapDir(t, root, "config.yaml", istioConfig)
	a := startReference(t, istioEnv(r.addr, root))
	b := startReference(t, istioEnv(r.addr, root))
	a.waitHealthcheck(t, http.StatusOK)
	b.waitHealthcheck(t, http.StatusOK)
	if _, body := a.healthcheck(); body != "OK" {
		t.Fatalf("/healthcheck body %q, want OK as the reference's", body)
	}

	// PATH "/": 1 a minute, across both replicas, in the reference's fixed
	// windows: every request below falls in one.
	awayFromEdge(time.Minute, 10*time.Second)
	minute := strconv.FormatInt(time.Now().Unix()/60*60, 10)
	if got := a.code(t, "/"); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first request: %v", got)
	}
	if got := b.code(t, "/"); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second request, on the other replica: %v, want OVER_LIMIT", got)
	}
	if got := a.code(t, "/"); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("third request: %v, want OVER_LIMIT", got)
	}
	// Any other path: 100 a minute.
	for i := range 6 {
		if got := []*referenceReplica{a, b}[i%2].code(t, "/other"); got != rlsv3.RateLimitResponse_OK {
			t.Fatalf("/other request %d: %v", i, got)
		}
	}
	// The counters are in the test's Redis, not in an embedded store, at the
	// reference's own keys (rules naming no algorithm count as it counts).
	keys, err := r.client.Keys(context.Background(), "*").Result()
	slices.Sort(keys)
	if want := []string{"echo-ratelimit_PATH_/_" + minute, "echo-ratelimit_PATH_/other_" + minute}; err != nil || !slices.Equal(keys, want) {
		t.Fatalf("keys in Redis: %q, %v; want the two counters %q", keys, err, want)
	}

	// The reference's debug port and metric names.
	code, text := httpGet(t, "http://"+a.debugAdr+"/rlconfig")
	if code != http.StatusOK || !strings.Contains(text, "echo-ratelimit.PATH_/: unit=MINUTE requests_per_unit=1, shadow_mode: false") {
		t.Fatalf("debug /rlconfig: %d %q", code, text)
	}
	_, metrics := httpGet(t, "http://"+b.httpAddr+"/metrics")
	for _, want := range []string{
		`ratelimit_service_rate_limit_over_limit{domain="echo-ratelimit",key1="PATH_/",key2=""} 1`,
		`ratelimit_service_rate_limit_total_hits{domain="echo-ratelimit",key1="PATH",key2=""} 3`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("replica b's /metrics lacks %s", want)
		}
	}
	if !strings.Contains(a.logs.String(), "variables of envoyproxy/ratelimit with no effect here") ||
		!strings.Contains(a.logs.String(), "RUNTIME_WATCH_ROOT") {
		t.Errorf("the variables with no effect are not logged")
	}
}

// TestRedisRefusingTheCredentialsIsNotReady: a Redis that rejects the
// password keeps the service unready (gRPC health and /healthcheck) until
// it accepts it.
func TestRedisRefusingTheCredentialsIsNotReady(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	ctx := context.Background()
	if err := r.client.ConfigSet(ctx, "requirepass", "right").Err(); err != nil {
		t.Fatal(err)
	}
	admin := redis.NewClient(&redis.Options{Addr: r.addr, Password: "right"})
	defer admin.Close()
	root := t.TempDir()
	configMapDir(t, root, "config.yaml", istioConfig)
	env := istioEnv(r.addr, root)
	env["REDIS_AUTH"] = "wrong-password"
	s := startReference(t, env)
	s.waitHealthcheck(t, http.StatusInternalServerError)
	for range 2 { // still not ready after each of two retries
		refused := errorReplies(t, admin, "WRONGPASS")
		waitFor(t, 10*time.Second, func() error {
			if n := errorReplies(t, admin, "WRONGPASS"); n <= refused {
				return fmt.Errorf("no new attempt: Redis refused the password %d times", n)
			}
			return nil
		})
		if code, body := s.healthcheck(); code != http.StatusInternalServerError {
			t.Fatalf("/healthcheck %d %q while Redis refuses the password", code, body)
		}
		resp, err := s.health.Check(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("gRPC health %v, %v; want NOT_SERVING", resp, err)
		}
	}
	if strings.Contains(s.logs.String(), "wrong-password") {
		t.Fatal("the password is in the log")
	}
	if err := admin.ConfigSet(ctx, "requirepass", "wrong-password").Err(); err != nil {
		t.Fatal(err)
	}
	s.waitHealthcheck(t, http.StatusOK)
}

// TestIncompleteRedisSettingRefusesToStart: a Redis variable without the
// URL does not start on the embedded store.
func TestIncompleteRedisSettingRefusesToStart(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	configMapDir(t, root, "config.yaml", istioConfig)
	for _, env := range []map[string]string{
		{"REDIS_SOCKET_TYPE": "tcp", "REDIS_AUTH": "hunter22"},
		{"RATELIMIT_REDIS_URL": ""},
	} {
		env["RUNTIME_ROOT"], env["RUNTIME_SUBDIRECTORY"], env["RUNTIME_IGNOREDOTFILES"] = root, "ratelimit", "true"
		s := startReference(t, env)
		select {
		case err := <-s.exited:
			s.exited <- err
			if err == nil {
				t.Fatalf("%v: exited without an error", env)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%v: still running", env)
		}
		out := s.logs.String()
		if !strings.Contains(out, "REDIS") && !strings.Contains(out, "Redis") || strings.Contains(out, "hunter22") {
			t.Fatalf("%v: output %q", env, out)
		}
	}
}

// TestPrometheusAddrAndKeyPrefix: USE_PROMETHEUS serves the metrics on
// PROMETHEUS_ADDR as the reference does (Envoy Gateway scrapes :19001), and
// CACHE_KEY_PREFIX prefixes the Redis keys.
func TestPrometheusAddrAndKeyPrefix(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	root := t.TempDir()
	configMapDir(t, root, "config.yaml", istioConfig)
	promAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	// RUNTIME_IGNOREDOTFILES, as Envoy Gateway sets it: else the ConfigMap's
	// file is read twice, as the reference reads it.
	s := startReference(t, map[string]string{
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": r.addr, "RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit",
		"USE_STATSD": "false", "USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": promAddr, "CACHE_KEY_PREFIX": "eg_",
		"LOG_LEVEL": "info", "RUNTIME_IGNOREDOTFILES": "true",
	})
	s.waitHealthcheck(t, http.StatusOK)
	awayFromEdge(time.Minute, 10*time.Second)
	minute := strconv.FormatInt(time.Now().Unix()/60*60, 10)
	if got := s.code(t, "/"); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first request: %v", got)
	}
	code, body := httpGet(t, "http://"+promAddr+"/metrics")
	if code != http.StatusOK || !strings.Contains(body, `ratelimit_service_rate_limit_within_limit{domain="echo-ratelimit",key1="PATH_/",key2=""} 1`) ||
		!strings.Contains(body, `ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 1`) {
		t.Fatalf("PROMETHEUS_ADDR /metrics: %d\n%s", code, body)
	}
	keys, err := r.client.Keys(context.Background(), "*").Result()
	if want := "eg_echo-ratelimit_PATH_/_" + minute; err != nil || len(keys) != 1 || keys[0] != want {
		t.Fatalf("keys %q, %v: want the reference's one, prefixed eg_: %s", keys, err, want)
	}
}
