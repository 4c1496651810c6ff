package config

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// reloads records what Watch reports.
type reloads struct {
	mu      sync.Mutex
	configs []*Config
	errs    []error
	changed chan struct{}
}

func watch(t *testing.T, path string) *reloads {
	t.Helper()
	return watchWith(t, path, Defaults{})
}

func watchWith(t *testing.T, path string, d Defaults) *reloads {
	t.Helper()
	r := &reloads{changed: make(chan struct{}, 100)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Watch(ctx, path, d, 20*time.Millisecond, func(c *Config) {
			r.mu.Lock()
			r.configs = append(r.configs, c)
			r.mu.Unlock()
			r.changed <- struct{}{}
		}, func(err error) {
			r.mu.Lock()
			r.errs = append(r.errs, err)
			r.mu.Unlock()
			r.changed <- struct{}{}
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	})
	// The watch loads once as it starts; the test's writes come after.
	r.next(t)
	r.mu.Lock()
	r.configs, r.errs = nil, nil
	r.mu.Unlock()
	return r
}

// next waits for the next reload or error.
func (r *reloads) next(t *testing.T) {
	t.Helper()
	select {
	case <-r.changed:
	case <-time.After(5 * time.Second):
		t.Fatal("no reload within 5s")
	}
}

// waitFor waits for a reload whose config satisfies ok: a change made in
// several steps may be read at any of them.
func (r *reloads) waitFor(t *testing.T, what string, ok func(*Config) bool) {
	t.Helper()
	for {
		select {
		case <-r.changed:
			if c, _ := r.last(); c != nil && ok(c) {
				return
			}
		case <-time.After(5 * time.Second):
			c, err := r.last()
			t.Fatalf("no reload %s within 5s; last config %v, error %v", what, c, err)
		}
	}
}

func (r *reloads) last() (*Config, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var c *Config
	var err error
	if len(r.configs) > 0 {
		c = r.configs[len(r.configs)-1]
	}
	if len(r.errs) > 0 {
		err = r.errs[len(r.errs)-1]
	}
	return c, err
}

func limitConfig(n int) string {
	return "domain: w\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: " + strings.Repeat("1", n) + "}\n"
}

func TestWatchReloadsAFileAndKeepsGoingAfterErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	writeFile(t, file, limitConfig(1))
	r := watch(t, file)

	writeFile(t, file, limitConfig(2))
	r.next(t)
	if c, _ := r.last(); c == nil || c.Rules()[0].RequestsPerUnit != 11 {
		t.Fatalf("after a good write: %v", c)
	}
	writeFile(t, file, "domain: w\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	r.next(t)
	if _, err := r.last(); err == nil || !strings.Contains(err.Error(), "rules.yaml:4") {
		t.Fatalf("after a bad write: error %v, want one naming rules.yaml:4", err)
	}
	writeFile(t, file, limitConfig(3))
	r.next(t)
	if c, _ := r.last(); c == nil || c.Rules()[0].RequestsPerUnit != 111 {
		t.Fatalf("the next good write after a bad one: %v", c)
	}
}

// TestWatchFollowsConfigMapSwaps replays what the kubelet does on a
// ConfigMap update: files live in a timestamped directory, the visible names
// are symlinks through "..data", and an update swaps "..data" atomically by
// renaming a new symlink over it.
func TestWatchFollowsConfigMapSwaps(t *testing.T) {
	for _, files := range []FileSet{YAMLFiles, VisibleFiles} {
		t.Run(files.String(), func(t *testing.T) { testWatchFollowsConfigMapSwaps(t, files) })
	}
}

func testWatchFollowsConfigMapSwaps(t *testing.T, files FileSet) {
	mount := t.TempDir()
	publish := func(version string, content string) {
		ts := filepath.Join(mount, "..2026_11_20_"+version)
		if err := os.Mkdir(ts, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(ts, "rules.yaml"), content)
		tmp := filepath.Join(mount, "..data_tmp")
		if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(mount, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	publish("1", limitConfig(1))
	if err := os.Symlink(filepath.Join("..data", "rules.yaml"), filepath.Join(mount, "rules.yaml")); err != nil {
		t.Fatal(err)
	}
	r := watchWith(t, mount, Defaults{Files: files})

	publish("2", limitConfig(2))
	r.next(t)
	c, err := r.last()
	if err != nil || c == nil || c.Rules()[0].RequestsPerUnit != 11 {
		t.Fatalf("after the swap: config %v, error %v", c, err)
	}
	if len(c.Files()) != 1 {
		t.Fatalf("files %q: the ..data directory must not be read twice", c.Files())
	}
}

func TestWatchDebouncesBursts(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), limitConfig(1))
	r := watch(t, dir)
	for i := 2; i <= 6; i++ {
		writeFile(t, filepath.Join(dir, "a.yaml"), limitConfig(i))
	}
	r.next(t)
	// A second reload of the burst would come within a few debounce
	// intervals: watch for 200 ms, stopping early if one comes.
	quiet := time.After(200 * time.Millisecond)
	for waiting := true; waiting; {
		select {
		case <-r.changed:
			r.mu.Lock()
			waiting = len(r.configs) == 1
			r.mu.Unlock()
		case <-quiet:
			waiting = false
		}
	}
	r.mu.Lock()
	n := len(r.configs)
	r.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d reloads for one burst of writes, want 1", n)
	}
}

// TestWatchReloadsAKeepChangingDirectory: events that keep coming push the
// reload back, but not past a bound.
func TestWatchReloadsAKeepChangingDirectory(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), limitConfig(1))
	r := watch(t, dir)
	stop := time.After(600 * time.Millisecond)
	tick := time.NewTicker(5 * time.Millisecond) // much faster than the 20 ms debounce
	defer tick.Stop()
	for writing := true; writing; {
		select {
		case <-stop:
			writing = false
		case <-tick.C:
			writeFile(t, filepath.Join(dir, "noise.txt"), time.Now().String())
		}
	}
	r.mu.Lock()
	n := len(r.configs)
	r.mu.Unlock()
	if n == 0 {
		t.Fatal("no reload during 600 ms of constant changes: the debounce postponed it forever")
	}
}

// TestWatchSeesSubdirectories: with a file set that reads subdirectories,
// a change deep down reloads, and so does one in a directory made after
// the watch started.
func TestWatchSeesSubdirectories(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: a\n")
	deeper := filepath.Join(dir, "sub", "deeper")
	if err := os.MkdirAll(deeper, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(deeper, "w"), limitConfig(1))
	r := watchWith(t, dir, Defaults{Files: VisibleFiles})
	limitOf := func(domain string, want uint32) func(*Config) bool {
		return func(c *Config) bool {
			for _, rule := range c.Rules() {
				if rule.Domain == domain {
					return rule.RequestsPerUnit == want
				}
			}
			return false
		}
	}

	writeFile(t, filepath.Join(deeper, "w"), limitConfig(2))
	r.waitFor(t, "with sub/deeper/w's new limit", limitOf("w", 11))

	made := filepath.Join(dir, "made", "later")
	if err := os.MkdirAll(made, 0o755); err != nil {
		t.Fatal(err)
	}
	other := func(n int) string { return strings.Replace(limitConfig(n), "domain: w", "domain: v", 1) }
	writeFile(t, filepath.Join(made, "v"), other(1))
	r.waitFor(t, "with the new directory's file", limitOf("v", 1))
	writeFile(t, filepath.Join(made, "v"), other(3))
	r.waitFor(t, "after a change in the new directory", limitOf("v", 111))
}
