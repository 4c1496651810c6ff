package settings

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Setting is one entry of the table: a flag, bound to a field of Settings.
type Setting struct {
	// Name is the flag's name; its environment variable is EnvName(Name).
	Name string
	// Help is the flag's one-line help; Doc, when set, is docs/flags.md's
	// longer text (Markdown).
	Help, Doc string
	// DocDefault is docs/flags.md's default column when the flag's own
	// default does not say it (a required flag).
	DocDefault string
	// Group names the flags set together from several of the reference's
	// variables: when any of them is set on the command line or by
	// RATELIMIT_*, the group's variables are left out whole (a --redis-url
	// and a REDIS_TYPE=CLUSTER would make two stores).
	Group string
	// Ref are the reference's variables that set this flag.
	Ref []RefVar

	bind  func(fs *flag.FlagSet, name, help string)
	check func() error
}

// RefVar is one variable of the reference.
type RefVar struct {
	Name    string
	Default string // the reference's default, "" for none
	// Conv turns the reference's value into the flag's (nil: as is); ""
	// leaves the flag as it is.
	Conv func(string) (string, error)
	// Joint: the variable is read together with others by one step of
	// planEnv (listeners, config path, TLS, metrics, Redis), not set alone.
	Joint bool
	// Here is what it does here, for docs/migration.md; empty: it sets its
	// flag as is.
	Here string
}

// The groups of flags set together from several variables.
const (
	groupRedis   = "redis"
	groupGRPCTLS = "grpc-tls"
	groupMetrics = "metrics"

	// groupRedisPerSecond: the per-second Redis (REDIS_PERSECOND_*).
	groupRedisPerSecond = "redis-persecond"
)

// EnvName is the environment variable of a flag: RATELIMIT_ and the flag's
// name in upper case, with _ for -.
func EnvName(flagName string) string {
	return "RATELIMIT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Binders of the table's entries to the fields of Settings, with their
// defaults: the flag package's own values, so that parse errors and
// printed defaults are its.

func stringFlag(p *string, def string) func(*flag.FlagSet, string, string) {
	return func(fs *flag.FlagSet, name, help string) { fs.StringVar(p, name, def, help) }
}

func boolFlag(p *bool, def bool) func(*flag.FlagSet, string, string) {
	return func(fs *flag.FlagSet, name, help string) { fs.BoolVar(p, name, def, help) }
}

func intFlag(p *int, def int) func(*flag.FlagSet, string, string) {
	return func(fs *flag.FlagSet, name, help string) { fs.IntVar(p, name, def, help) }
}

func floatFlag(p *float64, def float64) func(*flag.FlagSet, string, string) {
	return func(fs *flag.FlagSet, name, help string) { fs.Float64Var(p, name, def, help) }
}

func durationFlag(p *time.Duration, def time.Duration) func(*flag.FlagSet, string, string) {
	return func(fs *flag.FlagSet, name, help string) { fs.DurationVar(p, name, def, help) }
}

func byteSizeFlag(p *ByteSize, def ByteSize) func(*flag.FlagSet, string, string) {
	return func(fs *flag.FlagSet, name, help string) {
		*p = def
		fs.Var(p, name, help)
	}
}

// outOfRange is a value out of its flag's range: Validate says
// "--flag=value: want <want>".
type outOfRange struct {
	val  any
	want string
}

func (e *outOfRange) Error() string { return fmt.Sprintf("%v: want %s", e.val, e.want) }

// want refuses val unless ok, saying what a valid value is.
func want(ok bool, val any, what string) error {
	if ok {
		return nil
	}
	return &outOfRange{val, what}
}

// NewFlagSet is the flag set of the table, bound to s. Its Usage is the
// caller's to set.
func NewFlagSet(name string, s *Settings, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	for _, e := range table(s) {
		e.bind(fs, e.Name, e.Help)
	}
	return fs
}

// Parse reads flags, with RATELIMIT_* environment variables for the flags
// the command line does not set, then the reference's variables for the
// flags neither sets (env.go), then validates. The environment is read
// here, once. fs is NewFlagSet's for s.
func Parse(fs *flag.FlagSet, s *Settings, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		env := EnvName(f.Name)
		if v, ok := os.LookupEnv(env); ok && !set[f.Name] && err == nil {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s: %w", env, e)
			}
			set[f.Name] = true
		}
	})
	if err != nil {
		return err
	}
	plan, err := planEnv(os.LookupEnv, func(name string) bool { return set[name] })
	if err != nil {
		return err
	}
	for _, v := range plan.Values {
		if err := fs.Set(v.Flag, v.Value); err != nil {
			return fmt.Errorf("%s: %w", v.From, err)
		}
	}
	s.Reference = plan
	for name := range set {
		s.redisFlagSet = s.redisFlagSet || strings.HasPrefix(name, "redis-")
	}
	return Validate(s)
}

// Validate refuses values out of range and settings that do not go
// together, rather than replacing them with a default the operator did not
// ask for, in the table's order. It turns a --redis-url without a scheme
// into its URL.
func Validate(s *Settings) error {
	for _, e := range table(s) {
		if e.check == nil {
			continue
		}
		if err := e.check(); err != nil {
			if r := (*outOfRange)(nil); errors.As(err, &r) {
				return fmt.Errorf("--%s=%w", e.Name, err)
			}
			return err
		}
	}
	if s.RedisURL == "" && s.RedisClusterURL == "" && s.RedisSentinelURL == "" && s.RedisSettingGiven() {
		// Each replica would count alone: limits N times too loose, silently.
		return errors.New("a Redis setting is given but no Redis URL (--redis-url, --redis-cluster-url, --redis-sentinel-url, REDIS_URL): " +
			"refusing to start on the embedded store")
	}
	for _, u := range []struct {
		flag string
		url  *string
	}{{FlagRedisURL, &s.RedisURL}, {FlagRedisPerSecondURL, &s.RedisPerSecondURL}} {
		if *u.url != "" && !strings.Contains(*u.url, "://") {
			// host:port or a socket path, as the reference's REDIS_URL.
			full, err := singleURL(*u.url, "", "", false)
			if err != nil {
				return fmt.Errorf("--%s: %w (or a redis://, rediss:// or unix:// URL)", u.flag, err)
			}
			*u.url = full
		}
	}
	return nil
}

// Table is the table of settings, bound to a Settings of its own: for
// documents and tests, which read its names, help and variables.
func Table() []Setting { return table(new(Settings)) }
