// The dashboard's orders-by-tag page (`#/tags`): served after app.js as one script
// (`src/service/ui/mod.rs`), so it uses app.js's helpers (h, api, main, confirmAction, ...).
// ---------- orders by tag ----------

// Search the scheduled orders carrying a tag, in one queue or every queue; cancel them all
// after a confirmation that names the count (`/v1/[queues/{q}/]tags/{tag}`, issue 43).
function tagsPage(params) {
  const tag = (params.get('tag') || '').trim();
  const queue = params.get('queue') || '';
  const after = params.get('after');
  const queueSel = h('select', { id: 'tags-queue', name: 'queue' }, h('option', { value: '' }, 'every queue'));
  const tagInput = h('input', { id: 'tags-tag', name: 'tag', required: true, value: tag, autocomplete: 'off', placeholder: 'customer:42' });
  const form = h('form', { class: 'inline card', id: 'tags-form' },
    h('label', { for: 'tags-tag' }, 'Tag', h('br'), tagInput),
    h('label', { for: 'tags-queue' }, 'Queue', h('br'), queueSel),
    h('button', { type: 'submit', class: 'primary' }, 'Search'));
  const link = (t, q, a) => `#/tags?tag=${encodeURIComponent(t)}${q ? `&queue=${encodeURIComponent(q)}` : ''}${a ? `&after=${encodeURIComponent(a)}` : ''}`;
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    location.hash = link(tagInput.value.trim(), queueSel.value);
  });
  const notice = h('p', { class: 'notice', id: 'tags-notice', role: 'status', hidden: true });
  const result = h('section', { id: 'tags-result', 'aria-live': 'polite' });
  main().append(h('h1', {}, 'Orders by tag'), form, notice, result);
  api('GET', '/v1/queues').then(({ value }) => {
    queueSel.append(...value.queues.map((n) => h('option', { value: n, selected: n === queue }, n)));
  }).catch(showError);
  if (!tag) return tagInput.focus();
  const base = queue ? `/v1/queues/${encodeURIComponent(queue)}/tags/${encodeURIComponent(tag)}` : `/v1/tags/${encodeURIComponent(tag)}`;
  const where = queue ? `in ${queue}` : 'in every queue';
  async function cancelAll(count) {
    const n = count.total;
    const text = `Cancel ${num(n)} scheduled order${n === 1 ? '' : 's'} tagged ${tag} ${where}? They will not be dispatched; this cannot be undone.`;
    if (!(await confirmAction(text, 'Cancel orders'))) return;
    try {
      const { value } = await api('POST', `${base}:cancel`);
      notice.textContent = `Cancelled ${num(value.total)} order${value.total === 1 ? '' : 's'} tagged ${tag}.`;
      notice.hidden = false;
      await load();
    } catch (e) {
      showError(e);
    }
  }
  async function load() {
    const qs = new URLSearchParams({ limit: '50' });
    if (after) qs.set('after', after);
    const [{ value: count }, { value: page }] = await Promise.all([
      api('GET', base),
      api('GET', `${base}/messages?${qs}`),
    ]);
    const perQueue = Object.entries(count.queues);
    result.replaceChildren(...[
      h('h2', {}, h('span', { id: 'tags-count' }, num(count.total)), ` scheduled order${count.total === 1 ? '' : 's'} tagged `, h('code', {}, tag), ` ${where}`),
      perQueue.length > 1 ? h('p', { class: 'muted' }, perQueue.map(([q, n]) => `${q}: ${num(n)}`).join(' · ')) : null,
      count.total > 0
        ? h('div', { class: 'actions' }, h('button', { type: 'button', id: 'tags-cancel', class: 'danger', onclick: () => cancelAll(count) }, `Cancel all ${num(count.total)}`))
        : null,
      h('div', { class: 'scroll' }, h('table', { id: 'tags-orders' },
        h('thead', {}, h('tr', {}, ['Queue', 'Order', 'Due'].map((t) => h('th', { scope: 'col' }, t)))),
        h('tbody', {}, page.orders.length
          ? page.orders.map((o) => h('tr', { 'data-id': o.id },
            h('td', {}, o.queue),
            h('th', { scope: 'row' }, h('a', { href: `#/order?queue=${encodeURIComponent(o.queue)}&id=${encodeURIComponent(o.id)}` }, o.id)),
            h('td', {}, when(o.due_at_ms))))
          : [h('tr', {}, h('td', { colspan: 3, class: 'muted' }, 'No scheduled order carries this tag.'))]))),
      h('div', { class: 'actions' }, ...[
        after ? h('a', { class: 'button', href: link(tag, queue) }, 'First page') : null,
        page.next ? h('a', { class: 'button', id: 'tags-next', href: link(tag, queue, page.next) }, 'Next page') : null,
      ].filter(Boolean))].filter(Boolean));
  }
  load().catch(showError);
}
