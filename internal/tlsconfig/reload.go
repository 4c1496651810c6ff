package tlsconfig

import (
	"bytes"
	"fmt"
	"os"
	"sync"
	"time"
)

// CheckInterval is the least time between two looks at the files behind a
// config: a handshake reads them again only if the last look is older.
const CheckInterval = time.Second

// reloader holds what was parsed from a set of files, and parses them again
// when their contents change. Every method is safe for concurrent use.
//
// It compares contents, not modification times: a copy that keeps the
// mtime, a Kubernetes Secret volume swapping its symlinks and a rewrite in
// the same second are all seen. Reading a few small files at most once per
// interval costs next to nothing beside a handshake.
type reloader[T any] struct {
	paths    []string
	parse    func(contents [][]byte) (T, error)
	onError  func(error)
	interval time.Duration

	mu      sync.Mutex
	checked time.Time // last look at the files
	seen    [][]byte  // contents at the last successful read, loaded or not
	lastErr string    // last reported error, to report each failure once
	current T         // what the last good contents gave
}

// newReloader reads and parses paths once; an error here is the caller's to
// return: there is no previous good material to keep.
func newReloader[T any](paths []string, parse func([][]byte) (T, error), onError func(error), interval time.Duration) (*reloader[T], error) {
	contents, err := readFiles(paths)
	if err != nil {
		return nil, err
	}
	v, err := parse(contents)
	if err != nil {
		return nil, err
	}
	return &reloader[T]{
		paths:    paths,
		parse:    parse,
		onError:  onError,
		interval: interval,
		checked:  time.Now(),
		seen:     contents,
		current:  v,
	}, nil
}

// get returns the current material, first loading the files again if the
// last look is older than the interval and their contents changed. A file
// that cannot be read or parsed keeps the previous material; the error goes
// to onError once per distinct failure, outside the lock.
func (r *reloader[T]) get() T {
	v, err := r.refresh()
	if err != nil && r.onError != nil {
		r.onError(err)
	}
	return v
}

func (r *reloader[T]) refresh() (T, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if now.Sub(r.checked) < r.interval {
		return r.current, nil
	}
	r.checked = now
	contents, err := readFiles(r.paths)
	if err == nil {
		r.lastErr = ""
		if sameContents(contents, r.seen) {
			return r.current, nil
		}
		r.seen = contents
		var v T
		if v, err = r.parse(contents); err == nil {
			r.current, r.lastErr = v, ""
			return v, nil
		}
	}
	err = fmt.Errorf("tlsconfig: reload failed, keeping the previous certificates: %w", err)
	if err.Error() == r.lastErr {
		return r.current, nil
	}
	r.lastErr = err.Error()
	return r.current, err
}

// readFiles reads every path; an empty path reads as nil.
func readFiles(paths []string) ([][]byte, error) {
	contents := make([][]byte, len(paths))
	for i, p := range paths {
		if p == "" {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("read: %w", err)
		}
		contents[i] = b
	}
	return contents, nil
}

func sameContents(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}
