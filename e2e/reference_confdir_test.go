package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// teamConfig and extraConfig are the other domains of referenceConfigDir.
const (
	teamConfig = `domain: team
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
`
	extraConfig = `domain: extra
descriptors:
  - key: user
    value: alice
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
`
)

// referenceConfigDir lays out root/ratelimit/config as a Kubernetes
// ConfigMap volume whose keys have no .yaml extension, one of them put in a
// subdirectory by the volume's items (path: team/limits, which the kubelet
// links as team -> ..data/team), with a directory of another volume mounted
// inside it (extra/nested/limits.conf), and dot entries that are no config.
func referenceConfigDir(t *testing.T, root string) {
	t.Helper()
	dir := filepath.Join(root, "ratelimit", "config")
	data := filepath.Join(dir, "..2026_11_24_07_00_00.000000001")
	for _, d := range []string{filepath.Join(data, "team"), filepath.Join(dir, "extra", "nested"), filepath.Join(dir, ".git")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(data, "rules"), istioConfig)
	writeFile(t, filepath.Join(data, "team", "limits"), teamConfig)
	writeFile(t, filepath.Join(dir, "extra", "nested", "limits.conf"), extraConfig)
	writeFile(t, filepath.Join(dir, ".notes"), "Rules for the echo service.\n")
	writeFile(t, filepath.Join(dir, ".git", "HEAD"), "0123456789abcdef\n")
	links := [][2]string{{filepath.Base(data), "..data"}, {filepath.Join("..data", "rules"), "rules"}, {filepath.Join("..data", "team"), "team"}}
	for _, link := range links {
		if err := os.Symlink(link[0], filepath.Join(dir, link[1])); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReferenceConfigDirectory: envoyproxy/ratelimit itself and this
// service, each given the same environment (Istio's, RUNTIME_IGNOREDOTFILES
// =true) and the same directory, read the same rules from it (their debug
// ports' /rlconfig list the same lines) and answer the same. Neither reads
// team/limits: its top-level entry is a link to a directory, which the
// reference's walk does not follow.
func TestReferenceConfigDirectory(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	referenceConfigDir(t, root)
	// A Redis each: they must not share counters.
	up := startUpstream(t, istioEnv(startRedis(t).addr, root))
	ours := startReference(t, istioEnv(startRedis(t).addr, root))
	up.waitHealthcheck(t, http.StatusOK)
	ours.waitHealthcheck(t, http.StatusOK)

	upRules, ourRules := debugRules(t, up), debugRules(t, ours)
	if !slices.Equal(upRules, ourRules) {
		t.Fatalf("/rlconfig lines differ:\nenvoyproxy/ratelimit:\n%s\nthis service:\n%s", strings.Join(upRules, "\n"), strings.Join(ourRules, "\n"))
	}
	want := []string{"echo-ratelimit.PATH: ", "echo-ratelimit.PATH_/: ", "extra.user: ", "extra.user_alice: "}
	var got []string
	for _, l := range upRules {
		got = append(got, l[:strings.Index(l, " ")+1])
	}
	if !slices.Equal(got, want) {
		t.Fatalf("rules read %q, want %q:\n%s", got, want, strings.Join(upRules, "\n"))
	}

	// Fixed windows on both: no minute's edge between the two answers to one request.
	awayFromEdge(time.Minute, 10*time.Second)
	for i, req := range []*rlsv3.RateLimitRequest{
		request("echo-ratelimit", descriptor("PATH", "/")),
		request("echo-ratelimit", descriptor("PATH", "/")),
		request("extra", descriptor("user", "alice")),
		request("extra", descriptor("user", "alice")),
		request("extra", descriptor("user", "alice")),
		request("extra", descriptor("user", "bob")),
		request("team", descriptor("user", "carol")),
	} {
		if a, b := answer(t, up, req), answer(t, ours, req); a != b {
			t.Errorf("request %d (%s %v): envoyproxy/ratelimit answers %s, this service %s", i, req.Domain, req.Descriptors, a, b)
		}
	}

	// A change in a subdirectory reloads this service's config (the
	// reference, watching only the directory itself, would not see it).
	writeFile(t, filepath.Join(root, "ratelimit", "config", "extra", "nested", "limits.conf"),
		strings.Replace(extraConfig, "requests_per_unit: 5", "requests_per_unit: 7", 1))
	waitFor(t, 10*time.Second, func() error {
		if rules := debugRules(t, ours); !slices.ContainsFunc(rules, func(l string) bool {
			return strings.HasPrefix(l, "extra.user: unit=HOUR requests_per_unit=7,")
		}) {
			return fmt.Errorf("no reload after a change in extra/nested: %q", rules)
		}
		return nil
	})
}

// TestReferenceConfigDirectoryDotFiles: with RUNTIME_IGNOREDOTFILES unset
// (false), the reference reads a ConfigMap's file twice, in its timestamped
// directory and through its link, and refuses the config: its domain is
// defined twice. So does this service, which then does not start.
func TestReferenceConfigDirectoryDotFiles(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	configMapDir(t, root, "config.yaml", istioConfig)
	redisAddr := startRedis(t).addr
	env := func() map[string]string {
		return map[string]string{"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "USE_STATSD": "false", "LOG_LEVEL": "info",
			"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": redisAddr}
	}
	up := startUpstream(t, env())
	waitFor(t, 20*time.Second, func() error {
		if !strings.Contains(up.logs.String(), "duplicate domain 'echo-ratelimit' in config file") {
			return fmt.Errorf("envoyproxy/ratelimit has not refused the config; output:\n%s", up.logs)
		}
		return nil
	})

	ours := startReference(t, env())
	select {
	case err := <-ours.exited:
		ours.exited <- err
		if out := ours.logs.String(); err == nil || !strings.Contains(out, `domain "echo-ratelimit" already defined`) {
			t.Fatalf("exit %v, output %s; want a refusal naming the domain defined twice", err, out)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("still running, output:\n%s", ours.logs)
	}
}

// debugRules are the debug port's /rlconfig lines, sorted (the reference
// prints them in map order).
func debugRules(t *testing.T, r *referenceReplica) []string {
	t.Helper()
	code, text := httpGet(t, "http://"+r.debugAdr+"/rlconfig")
	if code != http.StatusOK {
		t.Fatalf("debug /rlconfig: %d %q", code, text)
	}
	var lines []string
	for l := range strings.SplitSeq(text, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	slices.Sort(lines)
	return lines
}

// answer is what of a response both services must agree on: the overall
// code, and each descriptor's code, limit and remaining count (not the time
// to the window's end, which depends on when it is asked).
func answer(t *testing.T, r *referenceReplica, req *rlsv3.RateLimitRequest) string {
	t.Helper()
	resp := r.ask(t, req)
	s := resp.OverallCode.String()
	for _, st := range resp.Statuses {
		s += fmt.Sprintf(" [%s", st.Code)
		if l := st.CurrentLimit; l != nil {
			s += fmt.Sprintf(" %d/%s remaining %d", l.RequestsPerUnit, l.Unit, st.LimitRemaining)
		}
		s += "]"
	}
	return s
}
