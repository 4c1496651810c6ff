package e2e

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestUseItFromGo builds the program of docs/go.md ("A whole program"), as
// it is written there, in a module of its own whose go.mod only requires
// this one and replaces it with this clone, as a user's module would; then
// runs it against a redis-server: it decides a limit from Go, then answers
// ShouldRateLimit to a grpc-go client on the counter it just charged.
func TestUseItFromGo(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/go.md")
	if err != nil {
		t.Fatal(err)
	}
	section := regexp.MustCompile("(?s)\n## A whole program\n.*?```go\n(.*?)```").FindSubmatch(doc)
	if section == nil {
		t.Fatal(`docs/go.md: no "## A whole program" section with a go block`)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	goMod := "module example.com/useit\n\ngo 1.26\n\nrequire github.com/slidingwindow/ratelimit v0.0.0\n\n" +
		"replace github.com/slidingwindow/ratelimit => " + root + "\n"
	for name, data := range map[string][]byte{"go.mod": []byte(goMod), "main.go": section[1]} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The sums this module's build checked start the program's go.sum; what
	// else resolving the program's own module graph needs (go.mod files this
	// module's pruned graph never reads) comes from the module proxy, as a
	// user's go build fetches it.
	sums, err := os.ReadFile("../go.sum")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sums, 0o600); err != nil {
		t.Fatal(err)
	}
	goCmd := func(args ...string) {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		// Built as the image and plainBinary are, so that the three share
		// their compiled packages.
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod -trimpath", "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	goCmd("build", "-o", "useit", ".")

	redisSrv := startRedis(t)
	listen := "127.0.0.1:" + strconv.Itoa(freePort(t))
	prog := exec.Command(filepath.Join(dir, "useit"))
	prog.Env = append(os.Environ(), "REDIS_ADDR="+redisSrv.addr, "LISTEN_ADDR="+listen)
	stdout, err := prog.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	prog.Stderr = &stderr
	if err := prog.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		_ = prog.Process.Kill() // when the test ended before its SIGTERM
		if err := <-exited; t.Failed() {
			t.Logf("the program's exit: %v", err)
		}
	})
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- line
		_, _ = io.Copy(io.Discard, stdout)
		exited <- prog.Wait() // after its output is read, as Wait requires
	}()
	select {
	case line := <-lines:
		if line != "admitted: true remaining: 2\n" {
			t.Fatalf("the program printed %q, want the decision on Redis; stderr: %s", line, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no decision printed in 30 s; stderr: %s", stderr.String())
	}

	conn, err := grpc.NewClient(listen, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user_id", Value: "42"}},
	}}}
	waitFor(t, 10*time.Second, func() error {
		c, err := net.DialTimeout("tcp", listen, time.Second)
		if err == nil {
			_ = c.Close() // only to know it listens
		}
		return err
	})
	// The program took one of 3 from Go: two calls fit, the third is denied.
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := client.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != want {
			t.Errorf("call %d: %v, want %v", i+1, resp.OverallCode, want)
		}
	}
	// SIGTERM: the program drains, stops its server, and exits cleanly.
	if err := prog.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err // for the cleanup
		if err != nil {
			t.Errorf("after SIGTERM: %v, want a clean exit; stderr: %s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Errorf("still running 30 s after SIGTERM")
	}
}
