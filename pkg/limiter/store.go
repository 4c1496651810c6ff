package limiter

import (
	"crypto/tls"
	"errors"
	"fmt"
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

// StoreConfig says which Redis holds the counters: at most one of URL,
// ClusterURL and SentinelURL; none starts the embedded store.
type StoreConfig struct {
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

// OpenStore connects to the configured Redis. It does not wait for the
// server: an unreachable store is answered by each rule's failure mode, and
// the client reconnects on its own.
func OpenStore(cfg StoreConfig) (*Store, error) {
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
			return nil, fmt.Errorf("redis cluster url: %w", err)
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
			return nil, fmt.Errorf("redis sentinel url: %w", err)
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
		return nil, fmt.Errorf("redis url: %w", err)
	}
	if opts.TLSConfig, err = withTLS(opts.TLSConfig, cfg.TLS); err != nil {
		return nil, err
	}
	configure(&opts.ContextTimeoutEnabled, &opts.MaxRetries)
	return &Store{Client: redis.NewClient(opts), Mode: "standalone", stop: func() {}}, nil
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
