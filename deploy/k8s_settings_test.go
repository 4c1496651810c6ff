package deploy

import (
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"

	"github.com/slidingwindow/ratelimit/internal/settings"
)

// ---------------------------------------------------------------------------
// What a container of the service runs with: its args and environment read
// by the service's own settings code, so that a manifest passing flags and
// one passing the reference's variables (REDIS_URL, RUNTIME_ROOT, PORT, ...)
// are held to the same checks.

// containerSettings are the settings the service would start with, and the
// flags that something in the manifest sets (a flag, RATELIMIT_*, or a
// variable of the reference's): the rest keep the binary's defaults.
type containerSettings struct {
	*settings.Settings
	explicit map[string]bool
	// fromSecret are the variables taken from a Secret, which the test
	// cannot read: a placeholder stands for each (secretPlaceholder).
	fromSecret map[string]*corev1.SecretKeySelector
}

// secretPlaceholder stands for a variable whose value is in a Secret: a
// value of the right form, on a host outside any build (".invalid"), so
// that what depends on the Secret's content is left unchecked.
func secretPlaceholder(env string) string {
	switch {
	case strings.HasSuffix(env, "SENTINEL_URL"):
		return "redis://from-secret.invalid:26379?master_name=from-secret"
	case strings.HasSuffix(env, "_URL"):
		return "redis://from-secret.invalid:6379"
	}
	return "from-secret"
}

// resolveSettings parses c's args and environment as the service does at
// start. The process environment is replaced for the parse only and
// restored at once: the settings code reads it directly.
func resolveSettings(c *corev1.Container) (*containerSettings, error) {
	cs := &containerSettings{Settings: new(settings.Settings), explicit: map[string]bool{},
		fromSecret: map[string]*corev1.SecretKeySelector{}}
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = secretPlaceholder(e.Name)
			cs.fromSecret[e.Name] = e.ValueFrom.SecretKeyRef
		case e.ValueFrom != nil:
			return nil, fmt.Errorf("env %s: only values and secretKeyRef are read here", e.Name)
		default:
			env[e.Name] = e.Value
		}
	}
	saved := os.Environ()
	os.Clearenv()
	for k, v := range env {
		if err := os.Setenv(k, v); err != nil {
			return nil, err
		}
	}
	fs := settings.NewFlagSet("ratelimit", cs.Settings, io.Discard)
	err := settings.Parse(fs, cs.Settings, c.Args)
	os.Clearenv()
	for _, kv := range saved {
		k, v, _ := strings.Cut(kv, "=")
		if serr := os.Setenv(k, v); serr != nil && err == nil {
			err = serr
		}
	}
	if err != nil {
		return nil, fmt.Errorf("the service would not start: %w", err)
	}
	for name := range flags(c.Args) {
		cs.explicit[name] = true
	}
	for _, s := range settings.Table() {
		if _, ok := env[settings.EnvName(s.Name)]; ok {
			cs.explicit[s.Name] = true
		}
	}
	for _, v := range cs.Reference.Values {
		cs.explicit[v.Flag] = true
	}
	return cs, nil
}

// redisEndpoint is where the service's store is, as the service's Redis
// client (go-redis) reads the URL.
type redisEndpoint struct {
	env   string   // the variable or flag it comes from
	mode  string   // standalone, cluster, sentinel
	addrs []string // host:port of the servers, or of the Sentinels
}

// redisEndpoints parses the Redis URLs the service would dial.
func (cs *containerSettings) redisEndpoints() ([]redisEndpoint, error) {
	var out []redisEndpoint
	for _, u := range []struct {
		flag, mode, url string
	}{
		{settings.FlagRedisURL, "standalone", cs.RedisURL},
		{settings.FlagRedisClusterURL, "cluster", cs.RedisClusterURL},
		{settings.FlagRedisSentinelURL, "sentinel", cs.RedisSentinelURL},
	} {
		if u.url == "" {
			continue
		}
		ep := redisEndpoint{env: "--" + u.flag, mode: u.mode}
		switch u.mode {
		case "standalone":
			if strings.HasPrefix(u.url, "unix://") {
				return nil, fmt.Errorf("--%s %s: a Unix socket, which no other pod reaches", u.flag, u.url)
			}
			o, err := redis.ParseURL(u.url)
			if err != nil {
				return nil, fmt.Errorf("--%s: %w", u.flag, err)
			}
			ep.addrs = []string{o.Addr}
		case "cluster":
			o, err := redis.ParseClusterURL(u.url)
			if err != nil {
				return nil, fmt.Errorf("--%s: %w", u.flag, err)
			}
			ep.addrs = o.Addrs
		case "sentinel":
			o, err := redis.ParseFailoverURL(u.url)
			if err != nil {
				return nil, fmt.Errorf("--%s: %w", u.flag, err)
			}
			if o.MasterName == "" {
				return nil, fmt.Errorf("--%s: no master_name", u.flag)
			}
			ep.addrs = o.SentinelAddrs
		}
		out = append(out, ep)
	}
	return out, nil
}

// secretProblems checks the Secret references of the service's variables:
// a Secret that is missing must keep the pod from starting, not start it
// without its Redis (on the embedded store, every replica counting alone).
func (cs *containerSettings) secretProblems() []string {
	var ps []string
	for _, env := range slices.Sorted(maps.Keys(cs.fromSecret)) {
		ref := cs.fromSecret[env]
		if ref.Name == "" || ref.Key == "" {
			ps = append(ps, fmt.Sprintf("env %s: secretKeyRef needs a name and a key", env))
		}
		if ref.Optional != nil && *ref.Optional {
			ps = append(ps, fmt.Sprintf("env %s: secretKeyRef is optional: without the Secret the service would start without it", env))
		}
	}
	return ps
}
