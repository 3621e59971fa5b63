package pyroscopetest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ProfileTypeSamples is the profile type rbscope's CPU profiles are
// counted in: samples per stack.
const ProfileTypeSamples = "process_cpu:samples:count:cpu:nanoseconds"

// Counts is what a server holds for one selection, by function name.
type Counts struct {
	Total     int64            // samples
	Self      map[string]int64 // samples whose innermost frame is the function
	Inclusive map[string]int64 // samples with the function anywhere on the stack
	Stacks    map[string]int64 // "outer;...;inner" -> samples
}

// Share is Self[name] as a percentage of Total.
func (c Counts) Share(name string) float64 {
	if c.Total == 0 {
		return 0
	}
	return 100 * float64(c.Self[name]) / float64(c.Total)
}

// jsonInt is a protobuf-JSON integer: a string ("42") or a number.
type jsonInt int64

func (n *jsonInt) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	if s == "" || s == "null" {
		*n = 0
		return nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("parse integer %s: %w", b, err)
	}
	*n = jsonInt(v)
	return nil
}

// pprofJSON is google.v1.Profile in protobuf JSON, the fields used here.
type pprofJSON struct {
	Sample []struct {
		LocationID []jsonInt `json:"locationId"`
		Value      []jsonInt `json:"value"`
	} `json:"sample"`
	Location []struct {
		ID   jsonInt `json:"id"`
		Line []struct {
			FunctionID jsonInt `json:"functionId"`
		} `json:"line"`
	} `json:"location"`
	Function []struct {
		ID   jsonInt `json:"id"`
		Name jsonInt `json:"name"`
	} `json:"function"`
	StringTable []string `json:"stringTable"`
}

// call posts a connect JSON request to the server's API.
func (s *Server) call(ctx context.Context, method string, req, resp any) error {
	return Call(ctx, s.URL(), method, req, resp)
}

// Call posts a connect JSON request (method "querier.v1.QuerierService/
// SelectMergeProfile", say) to the Pyroscope server at baseURL.
func Call(ctx context.Context, baseURL, method string, req, resp any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("encode %s request: %w", method, err)
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/"+method, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("build %s request: %w", method, err)
	}
	hr.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(hr)
	if err != nil {
		return fmt.Errorf("call %s: %w", method, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 256<<20))
	if err != nil {
		return fmt.Errorf("read %s answer: %w", method, err)
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("call %s: %s: %s", method, res.Status, tail(string(b), 500))
	}
	if err := json.Unmarshal(b, resp); err != nil {
		return fmt.Errorf("decode %s answer: %w", method, err)
	}
	return nil
}

// Query returns the samples the server holds for selector (a label
// selector such as `{service_name="app"}`) between start and end, merged
// over all series, by function.
func (s *Server) Query(ctx context.Context, selector string, start, end time.Time) (Counts, error) {
	return Query(ctx, s.URL(), selector, start, end)
}

// Query is Server.Query against any Pyroscope server.
func Query(ctx context.Context, baseURL, selector string, start, end time.Time) (Counts, error) {
	return queryType(ctx, baseURL, ProfileTypeSamples, selector, start, end)
}

// queryType merges the profiles of type typeID matching selector between
// start and end, by function.
func queryType(ctx context.Context, baseURL, typeID, selector string, start, end time.Time) (Counts, error) {
	req := map[string]any{
		"profile_typeID": typeID,
		"label_selector": selector,
		"start":          start.UnixMilli(),
		"end":            end.UnixMilli(),
	}
	var p pprofJSON
	if err := Call(ctx, baseURL, "querier.v1.QuerierService/SelectMergeProfile", req, &p); err != nil {
		return Counts{}, err
	}
	return countsOf(p)
}

func countsOf(p pprofJSON) (Counts, error) {
	c := Counts{Self: map[string]int64{}, Inclusive: map[string]int64{}, Stacks: map[string]int64{}}
	str := func(i jsonInt) (string, error) {
		if i < 0 || int(i) >= len(p.StringTable) {
			return "", fmt.Errorf("string index %d out of range", i)
		}
		return p.StringTable[i], nil
	}
	funcs := map[jsonInt]string{}
	for _, f := range p.Function {
		name, err := str(f.Name)
		if err != nil {
			return c, fmt.Errorf("function %d: %w", f.ID, err)
		}
		funcs[f.ID] = name
	}
	locs := map[jsonInt][]string{} // innermost first
	for _, l := range p.Location {
		var names []string
		for _, ln := range l.Line {
			names = append(names, funcs[ln.FunctionID])
		}
		// pprof lists a location's inlined lines innermost first too.
		locs[l.ID] = names
	}
	for _, smp := range p.Sample {
		if len(smp.Value) == 0 {
			continue
		}
		v := int64(smp.Value[0])
		var frames []string // innermost first
		for _, id := range smp.LocationID {
			frames = append(frames, locs[id]...)
		}
		if len(frames) == 0 {
			continue
		}
		c.Total += v
		c.Self[frames[0]] += v
		seen := map[string]bool{}
		for _, f := range frames {
			if !seen[f] {
				seen[f] = true
				c.Inclusive[f] += v
			}
		}
		outer := make([]string, len(frames))
		for i, f := range frames {
			outer[len(frames)-1-i] = f
		}
		c.Stacks[strings.Join(outer, ";")] += v
	}
	return c, nil
}

// AppSelector is the label selector of one application's profiles.
func AppSelector(app string) string {
	return fmt.Sprintf(`{service_name=%q}`, app)
}

// WaitForTotal polls Query until the total reaches want or timeout passes,
// and returns the last answer. Pyroscope makes pushed profiles queryable
// within a moment, but not synchronously.
func (s *Server) WaitForTotal(selector string, start, end time.Time, want int64, timeout time.Duration) (Counts, error) {
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c, err := s.Query(ctx, selector, start, end)
		cancel()
		if err == nil && c.Total >= want {
			return c, nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return c, err
			}
			return c, nil
		}
		time.Sleep(200 * time.Millisecond)
	}
}
