package configsource

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// File is the config of a file, or of a directory of files, read at start
// and, with Watch, again whenever the files change.
type File struct {
	Path     string
	Defaults config.Defaults
	// Watch reloads the config when its files change; a bad new config is
	// refused and the old one stays.
	Watch bool
	// Debounce is how long a burst of file events must be quiet before a
	// reload; 0: config.DefaultDebounce.
	Debounce time.Duration
	Log      *zap.Logger

	stop context.CancelFunc // ends the watch Follow started
	done chan struct{}      // closed when it has
}

var _ Source = (*File)(nil)

// Load reads the config once, as First does, for a caller that only checks
// it (ratelimit validate).
func (f *File) Load() (*config.Config, error) {
	return config.Load(f.Path, f.Defaults)
}

// First loads the config: a file config is there at start or not at all.
func (f *File) First(context.Context) (*config.Config, error) {
	cfg, err := f.Load()
	if err != nil {
		return nil, err
	}
	f.Log.Info("config loaded", zap.String("path", f.Path), zap.Int("rules", len(cfg.Rules())), zap.Strings("files", cfg.Files()))
	logWarnings(f.Log, cfg)
	return cfg, nil
}

// Follow watches the files, with Watch, until ctx ends or Close; without
// Watch nothing changes and it does nothing.
func (f *File) Follow(ctx context.Context, sink Sink) {
	if !f.Watch {
		return
	}
	debounce := f.Debounce
	if debounce == 0 {
		debounce = config.DefaultDebounce
	}
	ctx, f.stop = context.WithCancel(ctx)
	f.done = make(chan struct{})
	go func() {
		defer close(f.done)
		err := config.Watch(ctx, f.Path, f.Defaults, debounce, func(c *config.Config) {
			if sink.Reload(c) {
				logWarnings(f.Log, c)
			}
		}, sink.ReloadFailed)
		if err != nil {
			f.Log.Error("config watch stopped: reloads need a restart", zap.Error(err))
		}
	}()
}

// Configured is always true: First fails rather than start without one.
func (f *File) Configured() bool { return true }

// Close stops the watch, if any, and waits for it to end.
func (f *File) Close() error {
	if f.done != nil {
		f.stop()
		<-f.done
	}
	return nil
}
