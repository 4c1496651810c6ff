package app

import (
	"crypto/tls"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/metrics"
	"github.com/slidingwindow/ratelimit/internal/redisstore"
	"github.com/slidingwindow/ratelimit/internal/regions"
	"github.com/slidingwindow/ratelimit/internal/settings"
)

// openRegions opens the ledger and starts the decider of the global rules
// in front of the slices: a global rule's hits decided on this region's
// store (local, the main limiter) within the region's allowance. The
// ledger is not dialled here: one down at start is a region cut from it,
// whose global rules decide by their floor until it answers.
func openRegions(s *settings.Settings, redisTLS *tls.Config, a *App, local *limiter.Limiter, m *metrics.Metrics,
	tp trace.TracerProvider, now func() time.Time, log *zap.Logger) (*regions.Regions, error) {
	urls := []string{s.LedgerURL, s.LedgerClusterURL, s.LedgerSentinelURL}
	store, err := redisstore.Open(redisstore.Config{
		URL: urls[0], ClusterURL: urls[1], SentinelURL: urls[2], TLS: tlsOf(redisTLS, urls...),
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	a.onClose(func() { _ = store.Close() }) // as the main store's
	// The ledger is off the request path, maybe an ocean away: a call has a
	// renewal's turn, a quarter of a lease, whatever --store-timeout says
	// for the request path (a new connection alone costs it several round
	// trips); no deny cache (it decides no hit).
	ledger := limiter.New(store.Client, &limiter.Options{Timeout: s.GlobalLease / 4, DenyCache: -1, TracerProvider: tp, Now: now})
	a.onClose(ledger.Close)
	r, err := regions.New(a.slices, regions.Options{
		Region: s.Region, Regions: s.Regions, Ledger: ledger, Local: local, Counts: a.lim,
		Lease: s.GlobalLease, Refresh: s.GlobalRefresh, Now: now, Observe: m.RegionsObserver(),
	})
	if err != nil {
		return nil, err
	}
	a.onClose(r.Close) // before the limiters close: its renewals use them
	log.Info("global rules: one limit across regions", zap.String("region", s.Region), zap.Int("regions", s.Regions),
		zap.String("ledger", store.Mode))
	return r, nil
}
