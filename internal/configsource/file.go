package configsource

import (
	"context"
	"fmt"
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

// Run watches the files until ctx ends, when Watch is set; without it
// nothing changes and Run returns at once.
func (f *File) Run(ctx context.Context, sink Sink) error {
	if !f.Watch {
		return nil
	}
	debounce := f.Debounce
	if debounce == 0 {
		debounce = config.DefaultDebounce
	}
	err := config.Watch(ctx, f.Path, f.Defaults, debounce, func(c *config.Config) {
		if sink.Reload(c) {
			logWarnings(f.Log, c)
		}
	}, sink.ReloadFailed)
	if err != nil {
		return fmt.Errorf("config watch: %w", err)
	}
	return nil
}

// Configured is always true: First fails rather than start without one.
func (f *File) Configured() bool { return true }

// Close has nothing to free: Run's watch ends with its context.
func (f *File) Close() error { return nil }
