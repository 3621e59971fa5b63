package pyroscopetest

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// ProfileTypes lists the profile type IDs the server holds between start
// and end ("memory:alloc_objects:count:space:bytes", ...).
func (s *Server) ProfileTypes(ctx context.Context, start, end time.Time) ([]string, error) {
	req := map[string]any{"start": start.UnixMilli(), "end": end.UnixMilli()}
	var resp struct {
		ProfileTypes []map[string]any `json:"profileTypes"`
	}
	if err := s.call(ctx, "querier.v1.QuerierService/ProfileTypes", req, &resp); err != nil {
		return nil, err
	}
	var ids []string
	for _, t := range resp.ProfileTypes {
		for k, v := range t {
			if strings.EqualFold(k, "id") {
				ids = append(ids, fmt.Sprint(v))
			}
		}
	}
	return ids, nil
}

// QueryType is Query for the profile type typeID (one of ProfileTypes)
// instead of CPU samples.
func (s *Server) QueryType(ctx context.Context, typeID, selector string, start, end time.Time) (Counts, error) {
	return queryType(ctx, s.URL(), typeID, selector, start, end)
}
