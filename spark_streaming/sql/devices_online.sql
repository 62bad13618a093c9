-- Devices coming and going per --window (default 1 minute), from the client events.
-- connected/disconnected: distinct devices with such an event in the window; net_change: connects
-- minus disconnects, whose running sum is the number of devices online (see docs/analytics.md).
SELECT
  window.start AS window_start,
  window.end AS window_end,
  size(collect_set(CASE WHEN event = 'connected' THEN client_id END)) AS connected,
  size(collect_set(CASE WHEN event = 'disconnected' THEN client_id END)) AS disconnected,
  count_if(event = 'connected') - count_if(event = 'disconnected') AS net_change,
  count_if(event = 'disconnected' AND reason = 'keep_alive_timeout') AS keep_alive_timeouts,
  count_if(event = 'disconnected' AND reason = 'taken_over') AS taken_over
FROM events
WHERE event IN ('connected', 'disconnected')
GROUP BY window(timestamp, '${window}')
