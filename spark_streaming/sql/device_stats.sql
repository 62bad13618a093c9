-- Per device (client id) and --window (default 1 minute): statistics of the numeric JSON field
-- "c" of its messages ({"c": 21.5}); copy the file and change '$.c' for another field.
-- Messages whose payload has no number there are not counted.
SELECT
  window.start AS window_start,
  window.end AS window_end,
  client_id,
  count(*) AS messages,
  min(c) AS min_c,
  avg(c) AS avg_c,
  max(c) AS max_c,
  stddev_samp(c) AS stddev_c
FROM (
  SELECT client_id, timestamp,
         try_cast(get_json_object(CAST(payload AS STRING), '$.c') AS DOUBLE) AS c
  FROM messages
)
WHERE c IS NOT NULL
GROUP BY window(timestamp, '${window}'), client_id
