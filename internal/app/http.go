package app

import (
	"io"
	"net/http"
	"net/http/pprof"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/slidingwindow/ratelimit/internal/service"
	"github.com/slidingwindow/ratelimit/internal/transport"
)

// httpHandler serves the HTTP port: liveness and readiness for probes that
// speak HTTP (envoyproxy/ratelimit's /healthcheck among them), Prometheus
// metrics, the config in force, and the JSON API. ready says why the
// service is not ready, nil when it is.
func httpHandler(ready func() error, svc *service.Service, shedder *transport.Shedder, maxBody int, registry *prometheus.Registry,
	withPprof bool,
) http.Handler {
	mux := http.NewServeMux()
	if withPprof {
		addPprof(mux)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{Registry: registry}))
	mux.Handle("GET /rlconfig", svc.ConfigHandler())
	mux.Handle("/json", shedder.Handler(svc.JSONHandler(), maxBody))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		reply(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		reply(w, "ready\n")
	})
	// As envoyproxy/ratelimit answers it: OK, or a 500 when not ready.
	mux.HandleFunc("/healthcheck", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		reply(w, "OK")
	})
	return mux
}

func addPprof(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}

// debugHandler serves the debug port as envoyproxy/ratelimit's: /rlconfig
// as text (egctl reads it), an index at /, and the profiler with --pprof
// (the reference serves it always).
func debugHandler(svc *service.Service, withPprof bool) http.Handler {
	mux := http.NewServeMux()
	endpoints := "/rlconfig: print out the currently loaded configuration for debugging\n"
	if withPprof {
		addPprof(mux)
		endpoints += "/debug/pprof/: root of various pprof endpoints. hit for help.\n"
	}
	mux.Handle("GET /rlconfig", svc.ConfigTextHandler())
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) { reply(w, endpoints) })
	return mux
}

// reply writes s as the body. A write that fails is a client gone: there
// is no one left to tell.
func reply(w io.Writer, s string) { _, _ = io.WriteString(w, s) }

// metricsHandler serves the metrics alone at path, as envoyproxy/ratelimit's
// PROMETHEUS_ADDR port does.
func metricsHandler(registry *prometheus.Registry, path string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(path, promhttp.HandlerFor(registry, promhttp.HandlerOpts{Registry: registry}))
	return mux
}
