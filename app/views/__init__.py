"""The dashboard's pages (one module per page, run by Streamlit) and the panels they share."""
