package main

import (
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/serving"
)

// loadRequests reads the request trace kv simulate serves: the file's
// first limit requests (limit <= 0: all), by serving.ParseRequestsFile's
// rules and bounds, and at least one of them, as replay refuses a trace of
// no events.
func loadRequests(name string, limit int) ([]serving.Request, error) {
	reqs, err := serving.ParseRequestsFileFirst(name, limit)
	if err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, errors.Wrap(driver.ErrInvalid,
			"the trace holds no requests, nothing to simulate: an Azure or BurstGPT trace needs rows after its header, a Mooncake or Bailian trace a request a line")
	}
	return reqs, nil
}
