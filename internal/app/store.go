package app

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/metrics"
	"github.com/slidingwindow/ratelimit/internal/redisstore"
	"github.com/slidingwindow/ratelimit/internal/settings"
)

// storeReadyWait bounds how long New waits for the store at start.
const storeReadyWait = 3 * time.Second

// credentialsRetry is how often a store that refused the credentials is
// asked again.
const credentialsRetry = 2 * time.Second

// openStore opens the store the settings name (the embedded one when they
// name none).
func openStore(s *settings.Settings, redisTLS *tls.Config, log *zap.Logger) (*redisstore.Store, error) {
	store, err := redisstore.Open(redisstore.Config{
		URL: s.RedisURL, ClusterURL: s.RedisClusterURL, SentinelURL: s.RedisSentinelURL,
		TLS: tlsOf(redisTLS, s.RedisURL, s.RedisClusterURL, s.RedisSentinelURL),
	})
	if err != nil {
		return nil, err
	}
	if store.Mode == "embedded" {
		log.Warn("embedded store: an in-process miniredis, one replica, not shared with other instances, not persistent; use --redis-url in production")
	} else {
		log.Info("store", zap.String("mode", store.Mode))
	}
	return store, nil
}

// openPerSecondStore opens the store of the limits whose window is one
// second (--redis-persecond-*), nil when the settings name none: those
// limits are then counted on the main store.
func openPerSecondStore(s *settings.Settings, redisTLS *tls.Config, log *zap.Logger) (*redisstore.Store, error) {
	urls := []string{s.RedisPerSecondURL, s.RedisPerSecondClusterURL, s.RedisPerSecondSentinelURL}
	if urls[0] == "" && urls[1] == "" && urls[2] == "" {
		return nil, nil
	}
	store, err := redisstore.Open(redisstore.Config{
		URL: urls[0], ClusterURL: urls[1], SentinelURL: urls[2], TLS: tlsOf(redisTLS, urls...),
	})
	if err != nil {
		return nil, fmt.Errorf("per-second store: %w", err)
	}
	log.Info("per-second store: the limits of a one-second window are counted there", zap.String("mode", store.Mode))
	return store, nil
}

// tlsOf is the TLS config of a store named by urls (one set): the
// --redis-tls-* files serve every rediss:// store, as the reference's
// REDIS_TLS_* serve both of its Redis; a redis:// one gets none.
func tlsOf(redisTLS *tls.Config, urls ...string) *tls.Config {
	for _, u := range urls {
		if strings.HasPrefix(u, "rediss://") {
			return redisTLS
		}
	}
	return nil
}

// newLimiter is the limiter on store, reporting to m, tracing its Redis
// batches with tp, its deny cache on the clock now (the service's).
func newLimiter(s *settings.Settings, store *redisstore.Store, m *metrics.Metrics, tp trace.TracerProvider, now func() time.Time) *limiter.Limiter {
	denyCache := s.DenyCache
	if denyCache == 0 {
		denyCache = -1 // the flag's 0 means off; the option's 0 means its default
	}
	return limiter.New(store.Client, &limiter.Options{
		Timeout:    s.StoreTimeout,
		DenyCache:  denyCache,
		Observe:    func(d time.Duration, err error) { m.StoreCall(d, limiter.ErrorKind(err)) },
		Overloaded: m.Overloaded,

		TracerProvider: tp,
		Now:            now,
	})
}

// prepare opens the store's connections and loads the decide code before
// the service says it is ready, so the first requests pay no setup. A
// store that is not reachable yet does not hold the service back: rules
// answer by their failure mode until it is, and calls load the code when
// they can. A store that refuses the credentials is a setting to fix: it
// reports true, and the service is not ready until the store accepts them
// (see awaitCredentials).
func prepare(ctx context.Context, lim *limiter.Split, log *zap.Logger) (credentialsRefused bool) {
	prepareCtx, cancel := context.WithTimeout(ctx, storeReadyWait)
	defer cancel()
	if err := lim.Prepare(prepareCtx); redisstore.AuthRefused(err) {
		log.Error("Redis refused the credentials: not ready until it accepts them", zap.Error(err))
		return true
	} else if err != nil && ctx.Err() == nil { // not when the caller gave up
		log.Warn("store not ready: rules answer by their failure_mode until it is", zap.Error(err))
	}
	return false
}

// awaitCredentials asks the store again, every credentialsRetry, until it
// accepts the credentials (or fails otherwise: then the rules' failure
// modes answer, as for a store that is down), then calls accepted.
func awaitCredentials(ctx context.Context, lim *limiter.Split, log *zap.Logger, accepted func()) {
	t := time.NewTicker(credentialsRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, storeReadyWait)
		err := lim.Prepare(pctx)
		cancel()
		if redisstore.AuthRefused(err) || ctx.Err() != nil {
			continue
		}
		log.Info("Redis accepts the credentials: ready")
		accepted()
		return
	}
}
