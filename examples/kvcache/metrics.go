package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/metrics"
)

// metricsName is the name label of the cache's series: the preset.
const metricsName = "tiny"

// serveMetrics serves the cache's metrics (package metrics,
// vmarena_kvcache_*) at http://addr/metrics, in the text format
// Prometheus scrapes, until stop is called, and prints where. They are
// read at each scrape: what a scrape sees is the cache as it is then.
func serveMetrics(w io.Writer, addr string, c *kvcache.Cache) (url string, stop func() error, err error) {
	col, err := metrics.NewKVCacheCollector(metricsName, c)
	if err != nil {
		return "", nil, err
	}
	reg := prometheus.NewRegistry()
	if err := metrics.Register(reg, col); err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, errors.WithHint(errors.Wrapf(err, "-metrics %s", addr),
			"give a host:port this machine can listen on, e.g. 127.0.0.1:9090, or 127.0.0.1:0 for any free port")
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	url = "http://" + ln.Addr().String() + "/metrics"
	fmt.Fprintf(w, "The cache's metrics are served at %s while the example runs.\n", url)
	return url, func() error {
		err := srv.Close()
		if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
			err = errors.CombineErrors(err, serr)
		}
		return errors.Wrap(err, "serving the metrics")
	}, nil
}
