package limiter

import (
	"context"
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
	// Client is the Redis client; Sentinel and Cluster clients fit here too.
	Client redis.UniversalClient
	// Embedded reports an in-process miniredis: one replica, not shared
	// with other instances, not persistent.
	Embedded bool

	stop func()
}

// OpenStore connects to redisURL (redis:// or rediss://, with user and
// password), or starts an embedded in-process miniredis when it is empty. It
// does not wait for the server: an unreachable store is answered by each
// rule's failure mode, and the client reconnects on its own.
func OpenStore(redisURL string) (*Store, error) {
	return OpenStoreTLS(redisURL, nil)
}

// OpenStoreTLS is OpenStore with tlsConfig for the TLS of a rediss:// URL
// (custom CA, client certificate) instead of go-redis's default. A config
// without ServerName gets the URL's host; a skip_verify=true in the URL
// still applies. A non-nil tlsConfig with any other URL is an error: TLS
// settings that would not be used are a mistake.
func OpenStoreTLS(redisURL string, tlsConfig *tls.Config) (*Store, error) {
	if redisURL == "" {
		if tlsConfig != nil {
			return nil, errors.New("redis TLS settings need a rediss:// URL, not the embedded store")
		}
		return openEmbedded()
	}
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	if tlsConfig != nil {
		if opts.TLSConfig == nil {
			return nil, errors.New("redis TLS settings need a rediss:// URL")
		}
		cfg := tlsConfig.Clone()
		if cfg.ServerName == "" {
			cfg.ServerName = opts.TLSConfig.ServerName
		}
		cfg.InsecureSkipVerify = cfg.InsecureSkipVerify || opts.TLSConfig.InsecureSkipVerify
		opts.TLSConfig = cfg
	}
	configure(opts)
	client := redis.NewClient(opts)
	return &Store{Client: client, stop: func() {}}, nil
}

// configure sets what every store client needs, whatever the URL says.
func configure(opts *redis.Options) {
	// Without it go-redis ignores context deadlines on socket reads and
	// writes, and a stalled Redis would hold a decision past its deadline.
	opts.ContextTimeoutEnabled = true
	// The decide script is not idempotent: a retry after a connection lost
	// mid-reply would charge the request twice. A failed call is answered
	// by the failure mode instead.
	opts.MaxRetries = -1
}

// openEmbedded starts miniredis on a loopback port. miniredis only expires
// keys when told that time passed, so a ticker tells it every second.
func openEmbedded() (*Store, error) {
	m, err := miniredis.Run()
	if err != nil {
		return nil, fmt.Errorf("embedded store: %w", err)
	}
	opts := &redis.Options{Addr: m.Addr()}
	configure(opts)
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
	return &Store{Client: client, Embedded: true, stop: stop}, nil
}

// Ping checks that the store answers.
func (s *Store) Ping(ctx context.Context) error {
	return s.Client.Ping(ctx).Err()
}

// Close closes the client and stops an embedded server.
func (s *Store) Close() error {
	err := s.Client.Close()
	s.stop()
	return err
}
