package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// upstreamModule is envoyproxy/ratelimit's command, at the commit whose
// behaviour the tests take as the oracle (main on 2026-01-22): built from
// its module source, through the Go module proxy, the first time a test
// needs it.
const upstreamModule = "github.com/envoyproxy/ratelimit/src/service_cmd@v1.4.1-0.20260122083618-3fb702589d36"

var upstream struct {
	once sync.Once
	bin  string
	err  error
	out  []byte
}

// upstreamBinary builds envoyproxy/ratelimit once for all tests (go install
// into a directory of its own; Go's build cache makes later runs quick).
func upstreamBinary(t *testing.T) string {
	t.Helper()
	upstream.once.Do(func() {
		dir := filepath.Join(filepath.Dir(binary), "upstream")
		build := exec.Command("go", "install", upstreamModule)
		build.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=-mod=mod")
		upstream.out, upstream.err = build.CombinedOutput()
		upstream.bin = filepath.Join(dir, "service_cmd")
	})
	if upstream.err != nil {
		t.Fatalf("building envoyproxy/ratelimit (%s): %v\n%s", upstreamModule, upstream.err, upstream.out)
	}
	return upstream.bin
}

// startUpstream runs envoyproxy/ratelimit itself with env, as
// startReference runs this service.
func startUpstream(t *testing.T, env map[string]string) *referenceReplica {
	t.Helper()
	return startReplica(t, upstreamBinary(t), env)
}
