// Why a job is in its status, in words. The server records short identifiers for what it
// decides itself (`lease_expired`, `worker_lost`, `retried`, `cancelled`) and the worker's own
// words for how a process ended (`exited with code 3`, `timed out after 60 s`).

const SENTENCES = {
  lease_expired: 'Its worker stopped sending heartbeats, so the job went back to the queue.',
  worker_lost: 'Its worker stopped sending heartbeats too many times; the job was given up.',
  retried: 'Retried by hand.',
  cancelled: 'Cancelled.',
  'lease lost': 'Its worker lost the lease on it and stopped it.',
  abandoned: 'Its worker shut down and gave the job back to the queue.',
};

/** A reason as a sentence: a known identifier explained, free text capitalised, with a full stop. */
export function reasonText(reason) {
  if (!reason) return '';
  const known = SENTENCES[reason];
  if (known) return known;
  const text = reason.replace(/_/g, ' ').trim();
  const sentence = text.charAt(0).toUpperCase() + text.slice(1);
  return /[.!?)]$/.test(sentence) ? sentence : `${sentence}.`;
}
