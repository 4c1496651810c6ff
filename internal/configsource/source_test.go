package configsource

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/xdsconfig/xdsconfigtest"
)

// recorder is a Sink that passes on what it receives, in order.
type recorder struct {
	configs  chan *config.Config
	failures chan error
	inForce  string // hash of the config in force, as the service keeps it
}

func newRecorder(first *config.Config) *recorder {
	r := &recorder{configs: make(chan *config.Config, 16), failures: make(chan error, 16)}
	if first != nil {
		r.inForce = first.Hash()
	}
	return r
}

func (r *recorder) Reload(c *config.Config) bool {
	changed := c.Hash() != r.inForce
	r.inForce = c.Hash()
	r.configs <- c
	return changed
}

func (r *recorder) ReloadFailed(err error) { r.failures <- err }

// next returns the next config the sink was given, failing after a while.
func (r *recorder) next(t *testing.T) *config.Config {
	t.Helper()
	select {
	case c := <-r.configs:
		return c
	case err := <-r.failures:
		t.Fatalf("config refused: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("no config delivered")
	}
	return nil
}

// noLeaks fails t if it leaves a goroutine behind once its cleanups ran.
func noLeaks(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) }) // the first cleanup runs last
}

// follow hands the source's updates to sink until the test ends.
func follow(t *testing.T, src Source, sink Sink) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	src.Follow(ctx, sink)
}

func rule(n int) string {
	return fmt.Sprintf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", n)
}

func limitOf(c *config.Config) uint32 { return c.Rules()[0].RequestsPerUnit }

// TestFileFollowsTheFiles: a file source starts with the files' config,
// then hands each good change to the sink and each bad one as a failure.
func TestFileFollowsTheFiles(t *testing.T) {
	noLeaks(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "limits.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(rule(5))
	src := &File{Path: dir, Watch: true, Debounce: 10 * time.Millisecond, Log: zap.NewNop()}
	t.Cleanup(func() { src.Close() })
	first, err := src.First(context.Background())
	if err != nil || limitOf(first) != 5 || !src.Configured() {
		t.Fatalf("First: %v, %v", first, err)
	}
	sink := newRecorder(first)
	follow(t, src, sink)
	// The watch loads once as it starts: a change made between First and
	// the watch would otherwise wait for the next one.
	if c := sink.next(t); limitOf(c) != 5 {
		t.Fatalf("load at start: limit %d", limitOf(c))
	}
	write(rule(8))
	for c := sink.next(t); limitOf(c) != 8; c = sink.next(t) {
	}
	write("domain: [")
	select {
	case err := <-sink.failures:
		if err == nil {
			t.Error("a bad config was reported with a nil error")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a bad config was not reported")
	}
}

// TestFileWithoutWatch: without Watch, Follow watches nothing.
func TestFileWithoutWatch(t *testing.T) {
	noLeaks(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(rule(1)), 0o644); err != nil {
		t.Fatal(err)
	}
	src := &File{Path: dir, Log: zap.NewNop()}
	src.Follow(context.Background(), newRecorder(nil))
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := (&File{Path: filepath.Join(dir, "missing"), Log: zap.NewNop()}).First(context.Background()); err == nil {
		t.Fatal("First of a missing path: no error")
	}
}

// startXDS starts the xDS source as the service does.
func startXDS(t *testing.T, addr string, force bool) *XDS {
	t.Helper()
	x, err := StartXDS(context.Background(), XDSOptions{ServerURL: addr, NodeID: "envoy-ratelimit", BackoffInitial: 20 * time.Millisecond,
		BackoffMax: 100 * time.Millisecond, BackoffFactor: 2, ForceStart: force, Log: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close() })
	return x
}

// TestXDSWaitsForTheFirstConfig: without ForceStart, the service starts
// with the first config the server sends, then follows its changes.
func TestXDSWaitsForTheFirstConfig(t *testing.T) {
	noLeaks(t)
	srv := xdsconfigtest.Start(t)
	x := startXDS(t, srv.Addr, false)

	// Nothing served: First keeps waiting until its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if cfg, err := x.First(ctx); cfg != nil || err != nil || x.Configured() {
		t.Fatalf("First with nothing served: %v, %v; want nil, nil when the context ends", cfg, err)
	}

	srv.Set(t, "envoy-ratelimit", "1", xdsconfigtest.Config("api", "api", "user", 5, rlsconfv3.RateLimitUnit_MINUTE))
	cfg, err := x.First(context.Background())
	if err != nil || cfg == nil || !cfg.HasDomain("api") || !x.Configured() {
		t.Fatalf("First: %v, %v", cfg, err)
	}
	sink := newRecorder(cfg)
	follow(t, x, sink)

	srv.Set(t, "envoy-ratelimit", "2", xdsconfigtest.Config("api", "api", "user", 8, rlsconfv3.RateLimitUnit_MINUTE))
	c := sink.next(t)
	if limitOf(c) != 8 || len(c.Files()) != 1 || c.Files()[0] != "xds/api" {
		t.Errorf("second config: limit %d, files %q", limitOf(c), c.Files())
	}
}

// TestXDSForceStart: with ForceStart the service starts at once on an
// empty config, and takes the first one the server sends when it comes.
func TestXDSForceStart(t *testing.T) {
	noLeaks(t)
	srv := xdsconfigtest.Start(t)
	x := startXDS(t, srv.Addr, true)
	cfg, err := x.First(context.Background())
	if err != nil || cfg == nil || len(cfg.Rules()) != 0 || x.Configured() {
		t.Fatalf("First: %v, %v; want an empty config at once, not configured", cfg, err)
	}
	sink := newRecorder(cfg)
	follow(t, x, sink)
	srv.Set(t, "envoy-ratelimit", "1", xdsconfigtest.Config("api", "api", "user", 5, rlsconfv3.RateLimitUnit_MINUTE))
	if c := sink.next(t); len(c.Rules()) != 1 || !x.Configured() {
		t.Fatalf("config %v, configured %v", c.Rules(), x.Configured())
	}
}

// TestXDSWarnsOnChange: a config's warnings are logged when it arrives and
// when it changes, not each time the server resends it (as it does on every
// new stream), before and after the service takes over.
func TestXDSWarnsOnChange(t *testing.T) {
	load := func(n int) *config.Config {
		t.Helper()
		c, err := config.Parse("w.yaml", []byte(fmt.Sprintf(`domain: d
descriptors:
  - key: k
    metadata: {x: 1}
    descriptors: [{key: u, rate_limit: {unit: second, requests_per_unit: %d}}]
`, n)), config.Defaults{})
		if err != nil || len(c.Warnings()) != 1 {
			t.Fatalf("config: %v, warnings %q", err, c.Warnings())
		}
		return c
	}
	core, logs := observer.New(zap.WarnLevel)
	x := &XDS{log: zap.New(core), got: make(chan struct{})}
	warnings := func() int { return logs.FilterMessageSnippet("metadata on a descriptor without rate_limit").Len() }

	for i, step := range []struct {
		what string
		do   func()
		want int
	}{
		{"first config", func() { x.accepted(load(1)) }, 1},
		{"resent before the service starts", func() { x.accepted(load(1)) }, 1},
		{"changed before the service starts", func() { x.accepted(load(2)) }, 2},
		{"service starts", func() {
			cfg, err := x.First(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			x.Follow(context.Background(), newRecorder(cfg))
		}, 2},
		{"resent", func() { x.accepted(load(2)) }, 2},
		{"changed", func() { x.accepted(load(3)) }, 3},
		{"resent again", func() { x.accepted(load(3)) }, 3},
	} {
		step.do()
		if got := warnings(); got != step.want {
			t.Fatalf("step %d, %s: %d warnings logged, want %d", i+1, step.what, got, step.want)
		}
	}
}
