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

// Watch reloads path whenever something in it changes, until ctx ends. Each
// config that loads is passed to onLoad; each failure to onError, and the
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

	timer := time.NewTimer(debounce)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			onError(fmt.Errorf("watch %s: %w", dir, err))
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if ev.Op == fsnotify.Chmod {
				continue // touches and permission changes alter no content
			}
			timer.Reset(debounce)
		case <-timer.C:
			cfg, err := Load(path, d)
			if err != nil {
				onError(err)
				continue
			}
			onLoad(cfg)
		}
	}
}
