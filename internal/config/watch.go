package config

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultDebounce is how long Watch waits for a burst of file events to end
// before it reloads: editors and Kubernetes write several files and links
// for one change.
const DefaultDebounce = 250 * time.Millisecond

// Watch reloads path whenever something in it changes, until ctx ends, and
// once as it starts. Each config that loads is passed to onLoad (the caller
// skips one equal to the config in force); each failure to onError, and the
// previous config stays in force. It watches the directory (for a file, the
// directory holding it), because editors replace files by renaming and a
// Kubernetes ConfigMap update swaps a "..data" symlink rather than writing
// the files.
func Watch(ctx context.Context, path string, d Defaults, debounce time.Duration, onLoad func(*Config), onError func(error)) error {
	dir := path
	info, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("watch %s: %w", path, err)
	}
	if !info.IsDir() {
		dir = filepath.Dir(path)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", path, err)
	}
	defer w.Close()
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("watch %s: %w", dir, err)
	}

	// One load right away: a change made between the caller's own load
	// and the watch's start would otherwise wait for the next change.
	timer := time.NewTimer(debounce)
	defer timer.Stop()
	// Events push the reload back by debounce, but never past maxWait
	// from the first of a burst: a directory that keeps changing still
	// gets reloaded.
	maxWait := 8 * debounce
	var burst time.Time
	schedule := func() {
		if burst.IsZero() {
			burst = time.Now()
		}
		timer.Reset(min(debounce, time.Until(burst.Add(maxWait))))
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			// An overflow loses events: reload rather than miss one.
			onError(fmt.Errorf("watch %s: %w", dir, err))
			schedule()
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if ev.Op == fsnotify.Chmod {
				continue // touches and permission changes alter no content
			}
			schedule()
		case <-timer.C:
			burst = time.Time{}
			cfg, err := Load(path, d)
			if err != nil {
				onError(err)
				continue
			}
			onLoad(cfg)
		}
	}
}
