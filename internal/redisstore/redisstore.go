// Package redisstore connects to the Redis that holds the counters:
// standalone, Sentinel or Cluster from go-redis's URLs, or an embedded
// miniredis, with the client settings the limiter's calls need.
package redisstore

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Store is a connection to the Redis that holds the counters.
type Store struct {
	// Client is the Redis client: a *redis.Client (standalone, Sentinel,
	// embedded) or a *redis.ClusterClient.
	Client redis.UniversalClient
	// Mode is "standalone", "cluster", "sentinel" or "embedded". The
	// embedded store is an in-process miniredis: one replica, not shared
	// with other instances, not persistent.
	Mode string

	stop func()
}

// Config says which Redis holds the counters: at most one of URL,
// ClusterURL and SentinelURL; none starts the embedded store.
type Config struct {
	// URL is a standalone Redis: redis://[user:password@]host:port[/db], or
	// rediss:// for TLS.
	URL string
	// ClusterURL lists Redis Cluster seed nodes, in go-redis's format:
	// redis://[user:password@]host:port?addr=host2:port&addr=host3:port.
	ClusterURL string
	// SentinelURL lists Sentinels and names the master, in go-redis's
	// format: redis://[sentinel-user:sentinel-password@]host:port
	// ?master_name=NAME&addr=host2:port[&username=U&password=P for the master].
	SentinelURL string
	// TLS, when set, replaces go-redis's TLS settings of a rediss:// URL
	// (custom CA, client certificate). Without ServerName it takes the
	// URL's host; a skip_verify=true in the URL still applies. It is an
	// error with a redis:// URL or the embedded store: TLS settings that
	// would not be used are a mistake.
	TLS *tls.Config
}

// Open connects to the configured Redis. It does not wait for the
// server: an unreachable store is answered by each rule's failure mode, and
// the client reconnects on its own.
func Open(cfg Config) (*Store, error) {
	set := 0
	for _, u := range []string{cfg.URL, cfg.ClusterURL, cfg.SentinelURL} {
		if u != "" {
			set++
		}
	}
	switch {
	case set > 1:
		return nil, errors.New("redis: give one of a URL, a cluster URL and a sentinel URL")
	case set == 0 && cfg.TLS != nil:
		return nil, errors.New("redis TLS settings need a rediss:// URL, not the embedded store")
	case set == 0:
		return openEmbedded()
	case cfg.ClusterURL != "":
		opts, err := redis.ParseClusterURL(cfg.ClusterURL)
		if err != nil {
			return nil, urlError("redis cluster url", cfg.ClusterURL, err)
		}
		if opts.TLSConfig, err = withTLS(opts.TLSConfig, cfg.TLS); err != nil {
			return nil, err
		}
		// MaxRedirects is not set to 0: the limiter runs its scripts on
		// the slot masters' own clients, which MaxRetries governs.
		configure(&opts.ContextTimeoutEnabled, &opts.MaxRetries)
		return &Store{Client: redis.NewClusterClient(opts), Mode: "cluster", stop: func() {}}, nil
	case cfg.SentinelURL != "":
		opts, err := redis.ParseFailoverURL(cfg.SentinelURL)
		if err != nil {
			return nil, urlError("redis sentinel url", cfg.SentinelURL, err)
		}
		if opts.MasterName == "" {
			return nil, errors.New("redis sentinel url: master_name is missing")
		}
		if opts.TLSConfig, err = withTLS(opts.TLSConfig, cfg.TLS); err != nil {
			return nil, err
		}
		configure(&opts.ContextTimeoutEnabled, &opts.MaxRetries)
		return &Store{Client: redis.NewFailoverClient(opts), Mode: "sentinel", stop: func() {}}, nil
	}
	opts, err := redis.ParseURL(cfg.URL)
	if err != nil {
		return nil, urlError("redis url", cfg.URL, err)
	}
	if opts.TLSConfig, err = withTLS(opts.TLSConfig, cfg.TLS); err != nil {
		return nil, err
	}
	configure(&opts.ContextTimeoutEnabled, &opts.MaxRetries)
	return &Store{Client: redis.NewClient(opts), Mode: "standalone", stop: func() {}}, nil
}

// urlError reports a URL that does not parse without its password. A URL
// that is not one at all (net/url's error) may have been cut anywhere, even
// inside the password, so its parser's detail is dropped when the URL holds
// credentials; go-redis's own errors name a scheme, a path or an option.
func urlError(what, raw string, err error) error {
	shown := RedactURL(raw)
	var ue *url.Error
	if errors.As(err, &ue) {
		if shown != raw {
			return fmt.Errorf("%s %q: not a valid URL; the form is redis://[user:password@]host:port[/db]", what, shown)
		}
		return fmt.Errorf("%s %q: %v", what, raw, ue.Err)
	}
	return fmt.Errorf("%s %q: %s", what, shown, strings.ReplaceAll(err.Error(), raw, shown))
}

var passwordParam = regexp.MustCompile(`((?:^|[?&])(?:sentinel_)?password=)[^&]*`)

// RedactURL returns a Redis URL fit for messages and logs: the password of
// its user information, and password or sentinel_password query parameters,
// become xxxxx. A user information without ':' is hidden whole: go-redis
// reads it as a user name, but it is often a password put there by mistake.
// It works on malformed URLs too.
func RedactURL(raw string) string {
	i := strings.Index(raw, "://")
	if i < 0 {
		return passwordParam.ReplaceAllString(raw, "${1}xxxxx")
	}
	scheme, rest := raw[:i+3], raw[i+3:]
	// The user information ends at the last '@' of the authority; a '?'
	// may be in the password, so the whole rest is searched when the part
	// before the first '?' has no '@'.
	authority := rest
	if q := strings.IndexByte(rest, '?'); q >= 0 && strings.Contains(rest[:q], "@") {
		authority = rest[:q]
	}
	if at := strings.LastIndexByte(authority, '@'); at >= 0 {
		user := "xxxxx"
		if c := strings.IndexByte(rest[:at], ':'); c >= 0 {
			user = rest[:c] + ":xxxxx"
		}
		rest = user + rest[at:]
	}
	return scheme + passwordParam.ReplaceAllString(rest, "${1}xxxxx")
}

// AuthRefused reports whether err holds Redis refusing the client's
// credentials (WRONGPASS, NOAUTH, or AUTH sent to a server without
// passwords): a setting to fix, unlike a server that is not up yet.
func AuthRefused(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	for _, p := range []string{"WRONGPASS", "NOAUTH", "ERR AUTH", "ERR invalid password", "ERR invalid username-password"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// withTLS puts custom TLS settings in place of fromURL, the settings a
// rediss:// URL gave (nil for redis://).
func withTLS(fromURL, custom *tls.Config) (*tls.Config, error) {
	if custom == nil {
		return fromURL, nil
	}
	if fromURL == nil {
		return nil, errors.New("redis TLS settings need a rediss:// URL")
	}
	cfg := custom.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName = fromURL.ServerName
	}
	cfg.InsecureSkipVerify = cfg.InsecureSkipVerify || fromURL.InsecureSkipVerify
	return cfg, nil
}

// configure sets what every store client needs, whatever the URL says,
// through the fields that each kind of go-redis options has.
func configure(contextTimeoutEnabled *bool, maxRetries *int) {
	// Without it go-redis ignores context deadlines on socket reads and
	// writes, and a stalled Redis would hold a decision past its deadline.
	*contextTimeoutEnabled = true
	// The decide script is not idempotent: a retry after a connection lost
	// mid-reply would charge the request twice. A failed call is answered
	// by the failure mode instead.
	*maxRetries = -1
}

// openEmbedded starts miniredis on a loopback port. miniredis only expires
// keys when told that time passed, so a ticker tells it every second.
func openEmbedded() (*Store, error) {
	m, err := miniredis.Run()
	if err != nil {
		return nil, fmt.Errorf("embedded store: %w", err)
	}
	opts := &redis.Options{Addr: m.Addr()}
	configure(&opts.ContextTimeoutEnabled, &opts.MaxRetries)
	client := redis.NewClient(opts)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ticker := time.NewTicker(time.Second)
		defer ticker.Stop()
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-ticker.C:
				m.FastForward(now.Sub(last))
				last = now
			}
		}
	}()
	stop := func() {
		close(done)
		wg.Wait()
		m.Close()
	}
	return &Store{Client: client, Mode: "embedded", stop: stop}, nil
}

// Close closes the client and stops an embedded server.
func (s *Store) Close() error {
	err := s.Client.Close()
	s.stop()
	return err
}
