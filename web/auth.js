// Sign-in for servers that require tokens. The first request answered 401 opens a dialog
// asking for the user token; the token is sent once to POST /api/session, which answers with
// an HttpOnly cookie the browser then sends with every request, the event stream and
// downloads included. The page itself never stores the token. The cookie lasts for the
// browser session.

let pending = null;

/** Resolves once signed in; every caller that got a 401 meanwhile waits on the same dialog. */
export function signIn(reason) {
  if (!pending) {
    pending = ask(reason).finally(() => {
      pending = null;
    });
  }
  return pending;
}

function ask(reason) {
  return new Promise((resolve) => {
    const dialog = document.createElement('dialog');
    dialog.className = 'sign-in';
    const form = document.createElement('form');
    const title = document.createElement('h2');
    title.textContent = 'Sign in';
    const note = document.createElement('p');
    note.textContent = 'This server requires a user token (the value of APP_USER_TOKEN on the server, or a line of its user token file).';
    const label = document.createElement('label');
    label.textContent = 'Token ';
    const input = document.createElement('input');
    input.type = 'password';
    input.name = 'token';
    input.autocomplete = 'current-password';
    input.required = true;
    label.append(input);
    const error = document.createElement('p');
    error.className = 'error';
    error.setAttribute('role', 'alert');
    error.textContent = reason || '';
    const button = document.createElement('button');
    button.type = 'submit';
    button.textContent = 'Sign in';
    form.append(title, note, label, error, button);
    dialog.append(form);
    // Escape must not leave the page without a way to sign in.
    dialog.addEventListener('cancel', (event) => event.preventDefault());
    form.addEventListener('submit', async (event) => {
      event.preventDefault();
      button.disabled = true;
      error.textContent = '';
      try {
        const response = await fetch('/api/session', {
          method: 'POST',
          headers: { Authorization: `Bearer ${input.value.trim()}`, Accept: 'application/json' },
        });
        if (!response.ok) {
          const body = await response.json().catch(() => ({}));
          error.textContent = body.error || `${response.status} ${response.statusText}`;
          return;
        }
        input.value = '';
        dialog.close();
        dialog.remove();
        window.dispatchEvent(new Event('app:signed-in'));
        resolve();
      } catch (failure) {
        error.textContent = `cannot reach the server (${failure.message})`;
      } finally {
        button.disabled = false;
      }
    });
    document.body.append(dialog);
    dialog.showModal();
    input.focus();
  });
}
