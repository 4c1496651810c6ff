package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/slidingwindow/ratelimit/internal/settings"
)

const usage = `usage:
  ratelimit [serve] [flags]            serve the rate limit service
  ratelimit validate --config PATH     check a config and exit

Every flag can also be set as RATELIMIT_<NAME> in the environment, e.g.
RATELIMIT_REDIS_URL for --redis-url; a flag on the command line wins. The
environment of envoyproxy/ratelimit (REDIS_URL, PORT, RUNTIME_ROOT, ...) is
read too, below both (docs/migration.md). docs/flags.md tells more of each.

flags:
`

// Main is the ratelimit command: args are its arguments (without the
// program's name), out takes --help and validate's report. serve runs
// until ctx ends, then drains.
func Main(ctx context.Context, args []string, out io.Writer) error {
	if len(args) > 0 && filepath.Base(args[0]) == "ratelimit" {
		// The binary's own path as its first argument: an entrypoint
		// /bin/ratelimit given the command /bin/ratelimit, as envoyproxy/
		// ratelimit's docker-compose does (that binary ignores arguments).
		args = args[1:]
	}
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	var s settings.Settings
	fs := settings.NewFlagSet("ratelimit "+cmd, &s, out)
	fs.Usage = func() {
		fmt.Fprint(out, usage)
		fs.PrintDefaults()
	}
	if err := settings.Parse(fs, &s, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	switch cmd {
	case "serve":
		a, err := New(ctx, &s)
		if errors.Is(err, ErrStopped) {
			return nil
		}
		if err != nil {
			return err
		}
		return a.Run(ctx)
	case "validate":
		cfg, err := loadConfig(&s)
		if err != nil {
			return err
		}
		for _, w := range cfg.Warnings() {
			fmt.Fprintf(out, "warning: %s\n", w)
		}
		fmt.Fprintf(out, "%s: %d rules in %d files: ok\n", s.ConfigPath, len(cfg.Rules()), len(cfg.Files()))
		return nil
	}
	return fmt.Errorf("unknown command %q (serve or validate)", cmd)
}
