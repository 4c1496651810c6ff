package config

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
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
// previous config stays in force. It watches directories (for a file, the
// directory holding it), because editors replace files by renaming and a
// Kubernetes ConfigMap update swaps a "..data" symlink rather than writing
// the files; with d.Files reading subdirectories, every directory it reads,
// those that appear included.
func Watch(ctx context.Context, path string, d Defaults, debounce time.Duration, onLoad func(*Config), onError func(error)) error {
	dirs, err := d.Files.dirs(path)
	if err != nil {
		return fmt.Errorf("watch %s: %w", path, err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", path, err)
	}
	defer w.Close()
	if err := w.Add(dirs[0]); err != nil {
		return fmt.Errorf("watch %s: %w", dirs[0], err)
	}
	// watchAll watches the directories below, before each load, so that a
	// change after the load is seen and one before it is read. Adding a
	// watched directory again changes nothing; the watch of one removed
	// ends by itself.
	watchAll := func(dirs []string) {
		for _, dir := range dirs[1:] {
			if err := w.Add(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
				onError(fmt.Errorf("watch %s: %w: changes in it are not seen", dir, err))
			}
		}
	}
	watchAll(dirs)

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
			onError(fmt.Errorf("watch %s: %w", path, err))
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
			if dirs, err := d.Files.dirs(path); err == nil { // else Load says why
				watchAll(dirs)
			}
			cfg, err := Load(path, d)
			if err != nil {
				onError(err)
				continue
			}
			onLoad(cfg)
		}
	}
}
