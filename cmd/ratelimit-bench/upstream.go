package main

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// envoyproxy/ratelimit itself (the reference), measured beside the service
// in the skewed-keys scenarios (skew.go): built from its module source at
// the commit the e2e tests take as their oracle (e2e/upstream_test.go), and
// run as the e2e tests run it (e2e's startReplica): no arguments, only its
// own environment, its config file under RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/
// config, every other variable at its default.

// upstreamModule is envoyproxy/ratelimit's command, at e2e/upstream_test.go's
// version.
const upstreamModule = "github.com/envoyproxy/ratelimit/src/service_cmd@v1.4.1-0.20260122083618-3fb702589d36"

// upstreamSubdir is its RUNTIME_SUBDIRECTORY; the config file is in its
// config/ (RUNTIME_APPDIRECTORY's default).
const upstreamSubdir = "ratelimit"

// buildUpstream installs envoyproxy/ratelimit's command into dir/upstream
// (go install through the Go module proxy, GOFLAGS=-mod=mod as e2e does;
// Go's build cache makes later runs quick) and returns the binary's path.
// The error carries the end of go's output.
func buildUpstream(dir string) (string, error) {
	gobin := filepath.Join(dir, "upstream")
	cmd := exec.Command("go", "install", upstreamModule)
	cmd.Env = append(os.Environ(), "GOBIN="+gobin, "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s: %w: %s", upstreamModule, err, lastLines(string(out), 5))
	}
	return filepath.Join(gobin, "service_cmd"), nil
}

// lastLines is the last n non-empty lines of s, joined by "; ".
func lastLines(s string, n int) string {
	lines := strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' })
	return strings.Join(lines[max(0, len(lines)-n):], "; ")
}

// upstreamConfig is envoyproxy/ratelimit's config of the skewed-keys
// scenarios: the service's rule skewRuleKey of bench.yaml (same domain, key,
// unit and limit; TestSkewConfig checks that they agree) without what the
// reference does not read (it refuses a file with a key it does not know,
// such as algorithm), and its per-second sibling skew_second, the limit of
// the service's per-second rules. It only counts fixed windows.
func upstreamConfig() string {
	rule := "  - key: %s\n    rate_limit:\n      unit: %s\n      requests_per_unit: %d\n"
	second := Scenario{Dist: distZipf, Window: "second"}
	return fmt.Sprintf("domain: %s\ndescriptors:\n"+rule+rule,
		domain, skewRuleKey, skewUnit, skewLimit, second.RuleKey(), second.Window, skewSecondLimit)
}

// upstreamEnv is envoyproxy/ratelimit's whole environment: its config
// under root, Redis at redisAddr over TCP (REDIS_SOCKET_TYPE's default is
// unix), no statsd (USE_STATSD's default sends to localhost:8125), the
// three ports, and its listeners on loopback (HOST, GRPC_HOST and
// DEBUG_HOST default to 0.0.0.0). RUNTIME_WATCH_ROOT and
// RUNTIME_IGNOREDOTFILES as e2e's swap and per-second tests set them.
// Every other variable is at its default: LOG_LEVEL warn, REDIS_POOL_SIZE
// 10, no pipelining window, no local cache.
func upstreamEnv(root, redisAddr string, port, grpcPort, debugPort string) []string {
	return []string{
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=" + upstreamSubdir,
		"RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
		"USE_STATSD=false",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr,
		"HOST=127.0.0.1", "PORT=" + port,
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + grpcPort,
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + debugPort,
	}
}

// upstreamStatsNote says where envoyproxy/ratelimit's stats go in env when
// they cost it more than counting: to gostats' logging sink, which it
// takes when none of USE_STATSD, USE_DOG_STATSD, USE_PROMETHEUS and
// DISABLE_STATS is true. "" otherwise.
func upstreamStatsNote(env []string) string {
	for _, kv := range env {
		name, v, _ := strings.Cut(kv, "=")
		switch name {
		case "USE_STATSD", "USE_DOG_STATSD", "USE_PROMETHEUS", "DISABLE_STATS":
			if on, err := strconv.ParseBool(v); err == nil && on {
				return ""
			}
		}
	}
	return "With USE_STATSD=false and no other stats sink, its stats go to gostats' logging sink, a JSON line on its stderr " +
		"(a file here) per sample, as in Istio's sample deployment (which sets the same); " +
		"`-envoyproxy-env DISABLE_STATS=true` measures it without stats, `-envoyproxy-env USE_PROMETHEUS=true` with Prometheus's."
}

// upstream is a running envoyproxy/ratelimit.
type upstream struct {
	*process
	grpcAddr string
	env      []string // for the report
}

// withEnv is base with each variable of extra set: in base's place when
// base has it, else added at the end.
func withEnv(base, extra []string) []string {
	out := slices.Clone(base)
	for _, kv := range extra {
		name, _, _ := strings.Cut(kv, "=")
		if i := slices.IndexFunc(out, func(b string) bool { return strings.HasPrefix(b, name+"=") }); i >= 0 {
			out[i] = kv
		} else {
			out = append(out, kv)
		}
	}
	return out
}

// startUpstream writes the config under dir/envoyproxy and runs bin with
// upstreamEnv alone, extra set over it (-envoyproxy-env), waiting until its
// /healthcheck answers 200 (its config loaded and Redis reached).
func startUpstream(bin, dir, redisAddr string, extra []string) (*upstream, error) {
	root := filepath.Join(dir, "envoyproxy")
	confDir := filepath.Join(root, upstreamSubdir, "config")
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(confDir, "bench.yaml"), []byte(upstreamConfig()), 0o644); err != nil {
		return nil, err
	}
	var ports [3]string
	for i := range ports {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		_, ports[i], _ = net.SplitHostPort(addr)
	}
	env := withEnv(upstreamEnv(root, redisAddr, ports[0], ports[1], ports[2]), extra)
	p, err := launch("envoyproxy/ratelimit", filepath.Join(dir, "envoyproxy.log"), env, bin)
	if err != nil {
		return nil, err
	}
	health := "http://127.0.0.1:" + ports[0] + "/healthcheck"
	err = waitFor(p, 20*time.Second, func() error {
		resp, err := http.Get(health)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body) // only for the error's text
			return fmt.Errorf("/healthcheck: %s %s", resp.Status, strings.TrimSpace(b.String()))
		}
		return nil
	})
	if err != nil {
		p.stop(time.Second)
		return nil, err
	}
	return &upstream{process: p, grpcAddr: "127.0.0.1:" + ports[1], env: env}, nil
}
