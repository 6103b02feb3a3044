package openai

import (
	"net/url"
	"strconv"
	"strings"
)

// ResponseAfter reads where a client resumes a response's events: after
// sequence number startingAfter (the ?starting_after query), or else after
// lastEventID (the Last-Event-ID header: the id of the last event it read,
// as for chat); -1 when neither names one.
func ResponseAfter(lastEventID, startingAfter string) (int, *ParamError) {
	name, param, v := "Last-Event-ID", "", lastEventID
	if startingAfter != "" {
		name, param, v = "starting_after", "starting_after", startingAfter
	}
	if v == "" {
		return -1, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 {
		return -1, BadParam(param, "invalid_value", "'%s' must be a sequence number (a whole number), got %q", name, v)
	}
	return n, nil
}

// InputItemsQuery reads the list parameters of a response's input items
// (InputItemList) from qs, with OpenAI's defaults: order asc or desc
// (default desc), limit 1 to 100 (default 20).
func InputItemsQuery(qs url.Values) (order string, limit int, perr *ParamError) {
	limit = 20
	if v := qs.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return "", 0, BadParam("limit", "invalid_value", "'limit' must be an integer from 1 to 100, got %q", v)
		}
		limit = n
	}
	order = qs.Get("order")
	if order == "" {
		order = "desc"
	}
	if order != "asc" && order != "desc" {
		return "", 0, BadParam("order", "invalid_value", "'order' must be asc or desc, got %q", order)
	}
	return order, limit, nil
}
